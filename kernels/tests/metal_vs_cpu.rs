//! The Metal backend against the reference semantics (what every CPU
//! kernel is checked against too): every op weft's models use, on seeded
//! random inputs (the element-wise, norm, rope and attention cases are
//! `weft_testkit::cases`' lists, which `ops_vs_reference.rs` runs on the
//! CPU), through the same encode path the runtime uses (arena,
//! status words, matmul prologues, quantization companions), with the
//! tolerance stated per case.
//!
//! Compiled on macOS with `--features metal` only (see
//! `scripts/test-metal.sh`); elsewhere the file is empty. Without a Metal
//! device the tests skip with a message, unless `WEFT_TEST_REQUIRE_METAL=1`.

#[cfg(all(feature = "metal", target_os = "macos"))]
mod metal {
    use std::collections::BTreeMap;
    use weft_kernels::metal::mlx_native::{CommandEncoder, MlxBuffer, MlxDevice};
    use weft_kernels::metal::{
        read_u32s, route, Arena, MetalKernels, MetalTensor, MlxDType, NodeAux, Route,
    };
    use weft_ops::reference::HostMemory;
    use weft_ops::{DType, Op, OpNode, Tensor};
    use weft_testkit::cases::{self, OpCase};
    use weft_testkit::host::{encoded_tensor, node, run_ref};
    use weft_testkit::require::{or_skip, REQUIRE_METAL};
    use weft_testkit::Rng;

    /// The device and its kernels, or `None` (with a message) without one.
    fn gpu() -> Option<(MlxDevice, MetalKernels)> {
        let device = or_skip(REQUIRE_METAL, "a Metal device", MlxDevice::new())?;
        let kernels = MetalKernels::new(device.clone());
        kernels.prepare().expect("weft's Metal shaders compile");
        Some((device, kernels))
    }

    /// What a Metal run gives back besides memory.
    struct Run {
        mem: HostMemory,
        status: u32,
        /// The f32 image a `QuantizeRows` wrote (its companion).
        image: Option<Vec<f32>>,
    }

    fn upload(device: &MlxDevice, bytes: &[u8]) -> MlxBuffer {
        let len = bytes.len().max(1);
        let buf = device
            .alloc_buffer(len, MlxDType::U8, vec![len])
            .expect("alloc");
        // SAFETY: a fresh shared buffer of at least `bytes.len()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                buf.contents_ptr() as *mut u8,
                bytes.len(),
            )
        };
        buf
    }

    fn read(buf: &MlxBuffer, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        // SAFETY: the command buffer has completed; `buf` holds `n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (buf.contents_ptr() as *const u8).add(buf.byte_offset() as usize),
                out.as_mut_ptr(),
                n,
            )
        };
        out
    }

    /// Encodes `node` as the runtime does (prologue and barrier for a
    /// matmul on quantized activations, a companion for `QuantizeRows`),
    /// commits, waits and reads the outputs back into a copy of `mem`.
    fn run_metal(gpu: &(MlxDevice, MetalKernels), node: &OpNode, mem: &HostMemory) -> Run {
        let (device, kernels) = gpu;
        let mut buffers = BTreeMap::new();
        for t in node.inputs.iter().chain(&node.outputs) {
            buffers
                .entry(t.buffer)
                .or_insert_with(|| upload(device, mem.buffer(t.buffer)));
        }
        let resolve = |t: &Tensor| MetalTensor {
            buffer: buffers[&t.buffer].clone(),
            tensor: *t,
        };
        let ins: Vec<MetalTensor> = node.inputs.iter().map(resolve).collect();
        let outs: Vec<MetalTensor> = node.outputs.iter().map(resolve).collect();
        let mut enc: CommandEncoder = device.command_encoder().expect("encoder");
        let mut arena = Arena::new(device.clone());
        let status = arena.zeroed(4, MlxDType::U32).expect("status");
        let mut aux = NodeAux {
            status: Some((status.clone(), 0)),
            ..NodeAux::default()
        };
        if MetalKernels::needs_f32_activations(node) {
            let image = kernels
                .encode_prologue(&mut enc, &mut arena, node, &ins[0])
                .expect("prologue");
            aux.x_f32 = Some(image);
            enc.memory_barrier();
        }
        if matches!(node.op, Op::QuantizeRows) {
            let n = node.outputs[0].shape.elements();
            aux.companion_out = Some(arena.scratch(4 * n, MlxDType::F32).expect("image"));
        }
        kernels
            .encode(&mut enc, &mut arena, node, &ins, &outs, &aux)
            .unwrap_or_else(|e| panic!("encode {}: {e}", node.op.name()));
        enc.commit_and_wait().expect("command buffer");
        let mut out = mem.clone();
        for t in &node.outputs {
            let bytes = read(&buffers[&t.buffer], (t.offset + t.bytes()) as usize);
            out.bytes_mut(t)
                .copy_from_slice(&bytes[t.offset as usize..]);
        }
        let image = aux.companion_out.as_ref().map(|b| {
            let n = node.outputs[0].shape.elements();
            bytemuck::pod_collect_to_vec(&read(b, 4 * n))
        });
        // SAFETY: the command buffer completed; the view holds one word.
        let status = unsafe { read_u32s(&status, 1) }[0];
        Run {
            mem: out,
            status,
            image,
        }
    }

    /// Largest |a - b| / (|b| + floor) over the output, at most `tol`.
    fn compare(
        gpu: &(MlxDevice, MetalKernels),
        node: &OpNode,
        mem: &HostMemory,
        tol: f32,
        floor: f32,
        what: &str,
    ) {
        let kernel = route(node).expect("route");
        let got = run_metal(gpu, node, mem);
        assert_eq!(got.status, 0, "{what} ({kernel}): status word");
        let want = run_ref(node, mem);
        let out = node.outputs[0];
        let (g, w) = (got.mem.to_f32(&out).unwrap(), want.to_f32(&out).unwrap());
        let mut worst = 0f32;
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let e = (a - b).abs() / (b.abs() + floor);
            assert!(
                e.is_finite(),
                "{what} ({kernel}): non-finite {a} vs {b} at {i}"
            );
            worst = worst.max(e);
        }
        eprintln!("{what} on {kernel}: worst relative error {worst:.2e}");
        assert!(
            worst <= tol,
            "{what} ({kernel}): worst relative error {worst} > {tol}"
        );
    }

    /// A tensor of `dtype` holding random values (quantized for block types).
    fn values(mem: &mut HostMemory, rng: &mut Rng, dtype: DType, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let v = rng.vec(n, 1.0);
        encoded_tensor(mem, dtype, dims, &v)
    }

    /// Metal's bound against the reference for a shared case's op.
    fn tolerance(node: &OpNode) -> (f32, f32) {
        match &node.op {
            Op::Add | Op::Mul | Op::Scale { .. } => (1e-6, 1e-6),
            // Metal's exp is within a few ulps.
            Op::SiluMul => (1e-5, 1e-5),
            // GELU in its tanh form, as the reference computes it.
            Op::Gelu | Op::GeluMul => (1e-5, 1e-4),
            // f32 sums on the GPU, f64 in the reference.
            Op::RmsNorm { .. } => (1e-5, 1e-5),
            Op::LayerNorm { .. } => (1e-5, 0.1),
            Op::Softmax { .. } => (1e-5, 1e-6),
            // Metal's precise cos/sin against Rust's: a few ulps of the
            // angle (~2e-5 rad at position 190).
            Op::Rope(_) => (2e-4, 1e-2),
            // The kernel reads f16 caches exactly and computes in f32:
            // only the summation order differs.
            Op::Attention(_) => (1e-4, 5e-2),
            op => panic!("no Metal tolerance for {}", op.name()),
        }
    }

    /// Every case of a shared list, Metal against the reference.
    fn check_cases(gpu: &(MlxDevice, MetalKernels), cases: Vec<OpCase>) {
        for c in cases {
            let (tol, floor) = tolerance(&c.node);
            compare(gpu, &c.node, &c.mem, tol, floor, &c.name);
        }
    }

    #[test]
    fn elementwise_norms_and_softmax_match_reference() {
        let Some(gpu) = gpu() else { return };
        check_cases(&gpu, cases::elementwise(&mut Rng::new(1)));
    }

    #[test]
    fn argmax_copies_rows_and_writes_match_reference() {
        let Some(gpu) = gpu() else { return };
        let mut rng = Rng::new(2);
        let mut mem = HostMemory::default();
        let x = mem.f32_tensor(&[5, 300], &rng.vec(1500, 2.0)).unwrap();
        let ids = mem.zeros(DType::I32, &[5]).unwrap();
        compare(
            &gpu,
            &node(Op::Argmax, vec![x], vec![ids]),
            &mem,
            0.0,
            1.0,
            "argmax",
        );
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let o = mem.zeros(dt, &[5, 300]).unwrap();
            // One rounding to the narrow type. mlx-native's casts use
            // Metal's conversions (round to nearest even): exact for f16;
            // bf16 is allowed one unit in the last place.
            let tol = if dt == DType::BF16 { 1.0 / 128.0 } else { 0.0 };
            compare(
                &gpu,
                &node(Op::Copy, vec![x], vec![o]),
                &mem,
                tol,
                1e-6,
                "copy",
            );
            let back = mem.zeros(DType::F32, &[5, 300]).unwrap();
            let narrow = run_ref(&node(Op::Copy, vec![x], vec![o]), &mem);
            let widen = node(Op::Copy, vec![o], vec![back]);
            compare(&gpu, &widen, &narrow, 0.0, 1e-6, "copy back");
            // weft's own kernel writes bf16 caches (ggml's rounding): exact.
            let cache = mem.zeros(dt, &[16, 300]).unwrap();
            for (start, ring) in [(3, None), (14, Some(8)), (9, Some(4))] {
                let op = Op::SetRows { start, ring };
                compare(
                    &gpu,
                    &node(op, vec![x], vec![cache]),
                    &mem,
                    0.0,
                    1e-6,
                    "set_rows",
                );
            }
        }
        let data: Vec<u8> = (0..37u8).collect();
        let o = mem.zeros(DType::I8, &[37]).unwrap();
        let write = Op::Write { data: data.into() };
        let got = run_metal(&gpu, &node(write, vec![], vec![o]), &mem);
        assert_eq!(
            got.mem.bytes(&o),
            (0..37u8).collect::<Vec<_>>().as_slice(),
            "write"
        );
    }

    #[test]
    fn rope_matches_reference() {
        let Some(gpu) = gpu() else { return };
        check_cases(&gpu, cases::rope(&mut Rng::new(3)));
    }

    #[test]
    fn attention_matches_reference() {
        let Some(gpu) = gpu() else { return };
        check_cases(&gpu, cases::attention(&mut Rng::new(4)));
    }

    #[test]
    fn get_rows_matches_reference_and_flags_bad_ids() {
        let Some(gpu) = gpu() else { return };
        let mut rng = Rng::new(5);
        let tables = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
        ];
        for dtype in tables {
            let mut mem = HostMemory::default();
            let table = values(&mut mem, &mut rng, dtype, &[40, 512]);
            let ids: Vec<i32> = vec![3, 0, 39, 3, 17];
            let id = mem
                .tensor(DType::I32, &[5], bytemuck::cast_slice(&ids))
                .unwrap();
            let o = mem.zeros(DType::F32, &[5, 512]).unwrap();
            // Dequantization is the reference's, element by element.
            let op = node(Op::GetRows, vec![table, id], vec![o]);
            compare(&gpu, &op, &mem, 1e-6, 1e-6, &format!("get_rows {dtype}"));
            let bad: Vec<i32> = vec![1, 40];
            let id = mem
                .tensor(DType::I32, &[2], bytemuck::cast_slice(&bad))
                .unwrap();
            let o = mem.zeros(DType::F32, &[2, 512]).unwrap();
            let run = run_metal(&gpu, &node(Op::GetRows, vec![table, id], vec![o]), &mem);
            assert_eq!(
                run.status,
                weft_kernels::metal::STATUS_BAD_ID,
                "bad id flagged"
            );
        }
    }

    #[test]
    fn activation_quantization_is_bit_exact_with_its_f32_image() {
        let Some(gpu) = gpu() else { return };
        let mut rng = Rng::new(6);
        for dtype in [
            DType::Q8_0,
            DType::Q8_1,
            DType::Q8_K,
            DType::F16,
            DType::BF16,
        ] {
            let mut mem = HostMemory::default();
            let (rows, k) = (3, 512);
            let mut v = rng.vec(rows * k, 4.0);
            v[7] = 0.0;
            // An all-zero block in every format (a whole Q8_K block too).
            v[512..768].iter_mut().for_each(|x| *x = 0.0);
            let x = mem.f32_tensor(&[rows, k], &v).unwrap();
            let o = mem.zeros(dtype, &[rows, k]).unwrap();
            let n = node(Op::QuantizeRows, vec![x], vec![o]);
            let got = run_metal(&gpu, &n, &mem);
            let want = run_ref(&n, &mem);
            assert_eq!(
                got.mem.bytes(&o),
                want.bytes(&o),
                "quantize to {dtype}: bytes"
            );
            let image = got.image.expect("image");
            assert_eq!(
                image,
                want.to_f32(&o).unwrap(),
                "quantize to {dtype}: f32 image"
            );
        }
    }

    #[test]
    fn matmul_matches_reference_for_every_weight_format() {
        let Some(gpu) = gpu() else { return };
        let mut rng = Rng::new(7);
        let formats = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ];
        for dtype in formats {
            // SmolLM2's hidden size for 32-element blocks (18 blocks a row).
            let k = if dtype.block_len() == 256 { 512 } else { 576 };
            // 1 and 5 rows take mlx-native's mat-vec kernels, 40 its tiled
            // matmul (more than 8 rows).
            for (n, m) in [(1usize, 37usize), (5, 64), (40, 33)] {
                let mut mem = HostMemory::default();
                let w = values(&mut mem, &mut rng, dtype, &[m, k]);
                let x = mem.f32_tensor(&[n, k], &rng.vec(n * k, 1.0)).unwrap();
                let y = mem.zeros(DType::F32, &[n, m]).unwrap();
                let what = format!("matmul {dtype} x f32 [{n}x{k}]");
                // f32 sums of k products on the GPU, f64 in the reference.
                let mm = node(Op::MatMul, vec![x, w], vec![y]);
                compare(&gpu, &mm, &mem, 1e-4, 0.5, &what);
                // Activations quantized as the builder records it: the
                // prologue's f32 image against the reference's integer dot.
                let act = weft_ops::quant::vec_dot_type(dtype);
                if act != DType::F32 {
                    let xq = mem.zeros(act, &[n, k]).unwrap();
                    let q = node(Op::QuantizeRows, vec![x], vec![xq]);
                    let mem = run_ref(&q, &mem);
                    let what = format!("matmul {dtype} x {act} [{n}x{k}]");
                    let mm = node(Op::MatMul, vec![xq, w], vec![y]);
                    compare(&gpu, &mm, &mem, 1e-4, 0.5, &what);
                }
            }
        }
        // Rows shorter than mlx-native's dense tiles: weft's dense kernel.
        let mut mem = HostMemory::default();
        let w = values(&mut mem, &mut rng, DType::F16, &[9, 16]);
        let x = mem.f32_tensor(&[3, 16], &rng.vec(48, 1.0)).unwrap();
        let y = mem.zeros(DType::F32, &[3, 9]).unwrap();
        let mm = node(Op::MatMul, vec![x, w], vec![y]);
        assert_eq!(route(&mm).unwrap(), Route::Weft("weft_mul_mv_dense_f32"));
        compare(&gpu, &mm, &mem, 1e-5, 0.5, "matmul f16 x f32, k = 16");
    }
}
