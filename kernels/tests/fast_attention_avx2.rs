//! The fast attention kernels with this process's instruction set capped
//! at AVX2, so a machine with AVX-512 checks the AVX2 vector path as well
//! (`ops_vs_reference.rs` runs the same check with the best path). One
//! test in this binary: the cap must be set before any kernel runs.
//! Skipped on a machine without AVX2.

use weft_kernels::cpu::quant::Isa;

#[test]
fn fast_attention_matches_reference_on_avx2() {
    if !Isa::Avx2.is_supported() {
        eprintln!("skipping: this machine has no AVX2");
        return;
    }
    Isa::Avx2.select().expect("cap the instruction set at AVX2");
    assert_eq!(Isa::detect().expect("the instruction set"), Isa::Avx2);
    weft_testkit::checks::fast_attention_agrees();
}
