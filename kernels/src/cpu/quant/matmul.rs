//! The matmul driver: `out[t][r] = w_row(r) . act_row(t)` for a range of
//! weight rows (one thread's share) and all activation rows, dispatched on
//! the weight format and the instruction set.
//!
//! - AVX-512, 32-element formats: `avx512_b32::matvec` for one token,
//!   `avx512_b32::gemm` (packed panels, 4x8 register tiles) for more.
//! - AVX-512, Q4_K / Q6_K: `avx512_kq` (every order of `order.rs`).
//! - Everything else: the row-by-row dot products of the AVX2 or scalar
//!   path (same numerics), weight row outer so it stays in L1; Q4_K and
//!   Q6_K in the order `DotOrder::of` picks per token.

use super::formats::{self, Block32};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512_b32, avx512_b32_mv, avx512_kq};
use super::{float_gemm, scalar, DotOrder, Isa};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;
use weft_ops::{DType, OpError};

/// Columns `cols` of an `n x stride` row-major f32 matrix: the part of a
/// matmul output (`n` tokens x `stride` output features) one call fills.
/// Split it with [`OutColumns::split_at`] to hand disjoint column ranges to
/// threads.
pub struct OutColumns<'a> {
    ptr: NonNull<f32>,
    n: usize,
    stride: usize,
    cols: Range<usize>,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: an OutColumns is the unique writer of its columns (construction
// borrows the whole matrix mutably; `split_at` hands out disjoint column
// ranges), so moving it to another thread cannot create a data race.
unsafe impl Send for OutColumns<'_> {}

impl<'a> OutColumns<'a> {
    /// All `stride` columns of the `n x stride` matrix `out`.
    pub fn new(out: &'a mut [f32], n: usize, stride: usize) -> Result<Self, OpError> {
        let need = n
            .checked_mul(stride)
            .ok_or_else(|| bad(format!("{n} x {stride} output overflows")))?;
        if out.len() < need {
            return Err(bad(format!(
                "output of {} floats cannot hold {n} x {stride}",
                out.len()
            )));
        }
        Ok(OutColumns {
            ptr: NonNull::from(out).cast(),
            n,
            stride,
            cols: 0..stride,
            _out: PhantomData,
        })
    }

    /// An output view over raw memory.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `n x stride` floats for `'a`, and
    /// no one else may read or write columns `cols` of it meanwhile.
    pub unsafe fn from_raw(
        ptr: *mut f32,
        n: usize,
        stride: usize,
        cols: Range<usize>,
    ) -> Result<Self, OpError> {
        let ptr = NonNull::new(ptr).ok_or_else(|| bad("null output pointer".into()))?;
        if cols.end > stride || cols.start > cols.end {
            return Err(bad(format!("columns {cols:?} outside a row of {stride}")));
        }
        Ok(OutColumns {
            ptr,
            n,
            stride,
            cols,
            _out: PhantomData,
        })
    }

    /// The columns (output features, i.e. weight rows) this view covers.
    pub fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }

    /// Splits at absolute column `mid` (clamped into the range).
    pub fn split_at(self, mid: usize) -> (OutColumns<'a>, OutColumns<'a>) {
        let mid = mid.clamp(self.cols.start, self.cols.end);
        let left = OutColumns {
            cols: self.cols.start..mid,
            ..self
        };
        let right = OutColumns {
            cols: mid..self.cols.end,
            ..self
        };
        (left, right)
    }

    /// Pointer to element (token 0, first column).
    fn first(&self) -> *mut f32 {
        // SAFETY: cols.start <= stride, inside the n x stride allocation
        // (or one past its end when empty, which is never dereferenced).
        unsafe { self.ptr.as_ptr().add(self.cols.start) }
    }
}

fn bad(message: String) -> OpError {
    OpError::Param {
        op: "matmul",
        message,
    }
}

/// 64-byte aligned scratch memory, one per thread, grown on demand and
/// reused (steady-state prefill allocates nothing). Only the AVX-512
/// kernels use it.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

thread_local! {
    #[cfg(target_arch = "x86_64")]
    static SCRATCH: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    static ACT_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
pub(super) fn with_scratch<R>(bytes: usize, f: impl FnOnce(*mut u8) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let lines = bytes.div_ceil(64);
        if s.len() < lines {
            s.resize(lines, Line([0; 64]));
        }
        f(s.as_mut_ptr() as *mut u8)
    })
}

/// Activations converted on the fly when a caller passes f32 rows for a
/// weight format that multiplies another activation format.
pub(super) fn with_act_scratch<R>(bytes: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    ACT_SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < bytes {
            s.resize(bytes, 0);
        }
        f(&mut s[..bytes])
    })
}

/// Checked description of one matmul call.
pub(super) struct Problem<'w, 'a> {
    pub wdtype: DType,
    pub w: &'w [u8],
    pub k: usize,
    pub act: &'a [u8],
    pub n: usize,
}

impl Problem<'_, '_> {
    /// Validates lengths against `rows` (absolute weight rows).
    pub(super) fn check(&self, rows: &Range<usize>) -> Result<(usize, usize), OpError> {
        let adtype = weft_ops::quant::vec_dot_type(self.wdtype);
        let row_bytes = self.wdtype.row_bytes(self.k).ok_or_else(|| {
            bad(format!(
                "k = {} is not a whole number of {} blocks ({} each)",
                self.k,
                self.wdtype,
                self.wdtype.block_len()
            ))
        })?;
        let act_row = adtype
            .row_bytes(self.k)
            .ok_or_else(|| bad(format!("k = {} does not fit {adtype} blocks", self.k)))?;
        if rows
            .end
            .checked_mul(row_bytes)
            .is_none_or(|b| b > self.w.len())
        {
            return Err(bad(format!(
                "weight rows {rows:?} of {row_bytes} bytes exceed the {} bytes given",
                self.w.len()
            )));
        }
        if self
            .n
            .checked_mul(act_row)
            .is_none_or(|b| b > self.act.len())
        {
            return Err(bad(format!(
                "{} activation rows of {act_row} bytes exceed the {} bytes given",
                self.n,
                self.act.len()
            )));
        }
        Ok((row_bytes, act_row))
    }
}

/// Runs the product for the columns of `out` (= weight rows).
pub(super) fn run(isa: Isa, p: &Problem, out: &mut OutColumns) -> Result<(), OpError> {
    let rows = out.cols();
    if out.n < p.n {
        return Err(bad(format!("output has {} rows for {} tokens", out.n, p.n)));
    }
    let (row_bytes, act_row) = p.check(&rows)?;
    if rows.is_empty() || p.n == 0 {
        return Ok(());
    }
    // SAFETY: `check` proved rows.end * row_bytes <= w.len().
    let w = unsafe { p.w.as_ptr().add(rows.start * row_bytes) };
    let raw = RawCall {
        w,
        row_bytes,
        rows: rows.len(),
        act: p.act.as_ptr(),
        act_row,
        n: p.n,
        k: p.k,
        out: out.first(),
        stride: out.stride,
    };
    let isa = isa.checked()?;
    // SAFETY: the pointers cover the checked ranges and `out` is this
    // call's exclusive view of its columns; `isa` is supported.
    unsafe { dispatch(isa, p.wdtype, &raw) }
}

/// Raw pointers of a validated call (rows relative to `w`).
pub(super) struct RawCall {
    pub w: *const u8,
    pub row_bytes: usize,
    pub rows: usize,
    pub act: *const u8,
    pub act_row: usize,
    pub n: usize,
    pub k: usize,
    pub out: *mut f32,
    pub stride: usize,
}

unsafe fn dispatch(isa: Isa, wdtype: DType, c: &RawCall) -> Result<(), OpError> {
    match wdtype {
        DType::Q4_0 => block32::<formats::Q4_0>(isa, c),
        DType::Q4_1 => block32::<formats::Q4_1>(isa, c),
        DType::Q5_0 => block32::<formats::Q5_0>(isa, c),
        DType::Q5_1 => block32::<formats::Q5_1>(isa, c),
        DType::Q8_0 => block32::<formats::Q8_0>(isa, c),
        #[cfg(target_arch = "x86_64")]
        DType::Q4_K | DType::Q6_K if isa == Isa::Avx512 => avx512_kq::matmul(wdtype, c),
        DType::Q4_K | DType::Q6_K => {
            kquant_rowwise(isa, wdtype, c);
            Ok(())
        }
        DType::F32 | DType::F16 | DType::BF16
            if float_gemm::applies(wdtype, c.k, c.stride, c.n) =>
        {
            float_gemm::matmul(isa, wdtype, c);
            Ok(())
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            rowwise(c, |w, a| super::dot_raw(isa, wdtype, w, a, c.k));
            Ok(())
        }
        DType::Q2_K | DType::Q3_K | DType::Q5_K => {
            // No fast kernel yet: ggml's generic C order, row by row.
            let adtype = weft_ops::quant::vec_dot_type(wdtype);
            let mut failure = None;
            rowwise(c, |w, a| {
                let w = std::slice::from_raw_parts(w, c.row_bytes);
                let a = std::slice::from_raw_parts(a, c.act_row);
                weft_ops::quant::vec_dot_reference(wdtype, w, adtype, a).unwrap_or_else(|e| {
                    failure.get_or_insert(e);
                    f32::NAN
                })
            });
            failure.map_or(Ok(()), Err)
        }
        other => Err(OpError::Unsupported {
            op: "matmul",
            what: format!("{other} weights in the CPU quantized kernels"),
        }),
    }
}

unsafe fn block32<F: Block32>(isa: Isa, c: &RawCall) -> Result<(), OpError> {
    let nb = c.k / 32;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if c.n <= avx512_b32_mv::MAX_TOKENS => {
            let bytes = c.n * nb * size_of::<avx512_b32::TokBlock>();
            with_scratch(bytes, |s| {
                let tok = s as *mut avx512_b32::TokBlock;
                let (w, rb, rows, act, ar, out, st) =
                    (c.w, c.row_bytes, c.rows, c.act, c.act_row, c.out, c.stride);
                match c.n {
                    0 => {}
                    1 => avx512_b32_mv::matvec::<F, 1>(w, rb, rows, act, ar, nb, out, st, tok),
                    2 => avx512_b32_mv::matvec::<F, 2>(w, rb, rows, act, ar, nb, out, st, tok),
                    3 => avx512_b32_mv::matvec::<F, 3>(w, rb, rows, act, ar, nb, out, st, tok),
                    4 => avx512_b32_mv::matvec::<F, 4>(w, rb, rows, act, ar, nb, out, st, tok),
                    _ => unreachable!("at most MAX_TOKENS rows take the decode kernel"),
                }
            })
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => with_scratch(avx512_b32::gemm_scratch_bytes(c.n, nb), |s| {
            avx512_b32::gemm::<F>(
                c.w,
                c.row_bytes,
                c.rows,
                c.act,
                c.act_row,
                c.n,
                nb,
                c.out,
                c.stride,
                s,
            )
        }),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => rowwise(c, |w, a| avx2::dot_block32::<F>(w, a, nb)),
        // Off x86 the scalar path is the only one `Isa::checked` admits.
        _ => rowwise(c, |w, a| {
            let ws = std::slice::from_raw_parts(w, c.row_bytes);
            let as_ = std::slice::from_raw_parts(a, c.act_row);
            scalar::dot_block32::<F>(ws, as_, nb)
        }),
    }
    Ok(())
}

/// Q4_K / Q6_K on the scalar or AVX2 path: weight row outer, tokens
/// inner, each product in the order `DotOrder::of` gives its token.
unsafe fn kquant_rowwise(isa: Isa, wdtype: DType, c: &RawCall) {
    let (q6, nb) = (wdtype == DType::Q6_K, c.k / 256);
    for r in 0..c.rows {
        let w = c.w.add(r * c.row_bytes);
        for t in 0..c.n {
            let order = DotOrder::of(wdtype, c.stride, c.n, t);
            let a = c.act.add(t * c.act_row);
            *c.out.add(t * c.stride + r) = match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 | Isa::Avx512 => avx2::dot_kquant(order, q6, w, a, nb),
                _ => {
                    let ws = std::slice::from_raw_parts(w, c.row_bytes);
                    let as_ = std::slice::from_raw_parts(a, c.act_row);
                    scalar::dot_kquant(order, q6, ws, as_, nb)
                }
            };
        }
    }
}

/// Weight row outer, tokens inner.
unsafe fn rowwise(c: &RawCall, mut dot: impl FnMut(*const u8, *const u8) -> f32) {
    for r in 0..c.rows {
        let w = c.w.add(r * c.row_bytes);
        for t in 0..c.n {
            *c.out.add(t * c.stride + r) = dot(w, c.act.add(t * c.act_row));
        }
    }
}
