//! Parameters of rotary embedding over the trailing dimensions of each
//! head (`TailRope`), with YaRN frequency interpolation.

/// YaRN frequency interpolation without magnitude scaling (DeepSeek-V4's
/// form): pair `i` turns at `f_i / factor * ramp_i + f_i * (1 - ramp_i)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    /// Context extension factor `s`.
    pub factor: f32,
    /// Training context length `L0`.
    pub orig_ctx: u32,
    /// Rotations per context above which a pair keeps its frequency.
    pub beta_fast: f32,
    /// Rotations per context below which a pair is fully interpolated.
    pub beta_slow: f32,
}

/// Rotary embedding of the **last** `n_dims` elements of each head, in
/// interleaved pairs `(j, j + 1)` with `j = head_dim - n_dims + 2i`; the
/// first `head_dim - n_dims` elements pass through. The angle of pair `i`
/// at position `p` is `p * inv_freq[i]`, one f32 product (as PyTorch
/// computes it); `inverse` turns by `-p * inv_freq[i]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailRopeParams {
    /// Elements per head; a row holds `cols / head_dim` heads.
    pub head_dim: usize,
    /// Rotated elements at the end of each head (even, <= head_dim).
    pub n_dims: usize,
    /// Frequency base `theta`: `f_i = theta^(-2i / n_dims)`.
    pub base: f32,
    /// YaRN interpolation of the frequencies, if any.
    pub yarn: Option<YarnScaling>,
    /// Rotate backwards (undo a rotation at the same position).
    pub inverse: bool,
}

impl TailRopeParams {
    /// The `n_dims / 2` frequencies, computed in f64 and rounded once.
    pub fn inv_freq(&self) -> Vec<f32> {
        let r = self.n_dims as f64;
        let base = self.base as f64;
        let half = self.n_dims / 2;
        let plain = |i: usize| base.powf(-((2 * i) as f64) / r);
        let Some(y) = self.yarn else {
            return (0..half).map(|i| plain(i) as f32).collect();
        };
        // corr(beta) = r ln(L0 / (2 pi beta)) / (2 ln theta)
        let corr = |beta: f64| {
            r * (y.orig_ctx as f64 / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * base.ln())
        };
        let lo = corr(y.beta_fast as f64).floor().max(0.0);
        let mut hi = corr(y.beta_slow as f64).ceil().min(r - 1.0);
        if lo == hi {
            hi = lo + 0.001;
        }
        let factor = y.factor as f64;
        (0..half)
            .map(|i| {
                let f = plain(i);
                let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                (f / factor * ramp + f * (1.0 - ramp)) as f32
            })
            .collect()
    }

    /// `(cos, sin)` of every rotated pair at `position` (sin negated when
    /// `inverse`), from `inv_freq`.
    pub fn angles(&self, inv_freq: &[f32], position: i32, out: &mut Vec<(f32, f32)>) {
        out.clear();
        for &f in inv_freq {
            let theta = position as f32 * f;
            let (s, c) = (theta as f64).sin_cos();
            let s = if self.inverse { -s } else { s };
            out.push((c as f32, s as f32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_frequencies_match_the_fixture_table() {
        // flash-tiny: theta 160000, r 16, factor 16, L0 65536, beta 32/1 (lo 3, hi 7).
        let p = TailRopeParams {
            head_dim: 64,
            n_dims: 16,
            base: 160000.0,
            yarn: Some(YarnScaling {
                factor: 16.0,
                orig_ctx: 65536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            inverse: false,
        };
        let want: [f64; 8] = [
            1.0,
            0.223606795,
            0.0500000007,
            0.0111803403,
            0.00191406242,
            0.000296977785,
            3.71093774e-05,
            1.74692821e-06,
        ];
        for (g, w) in p.inv_freq().iter().zip(want) {
            let g = *g as f64;
            assert!((g - w).abs() <= w * 2e-7, "{g} vs {w}");
        }
        let main = TailRopeParams {
            base: 10000.0,
            yarn: None,
            ..p
        };
        assert!((main.inv_freq()[1] as f64 - 0.316227764).abs() < 1e-8);
    }
}
