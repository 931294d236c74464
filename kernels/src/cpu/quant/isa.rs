//! Which instruction set the quantized kernels run on: detected once per
//! process, capped by the caller ([`Isa::select`], from the executor's
//! configuration: `WEFT_CPU_ISA` on the command line), and selectable per
//! call so tests can run every path on one machine.

use std::sync::atomic::{AtomicU8, Ordering};
use weft_ops::OpError;

/// A kernel path. Every path computes bit-identical results (they all
/// follow ggml's x86 lane structure); they differ only in speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Scalar,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW/VL/DQ with VNNI (Ice Lake, Sapphire Rapids, Zen 4/5).
    Avx512,
}

/// The setting that caps the path (`scalar`, `avx2`, `avx512`), named in
/// error messages (the `weft` crate reads it).
pub const ISA_ENV: &str = "WEFT_CPU_ISA";

const UNSET: u8 = 0;
static DETECTED: AtomicU8 = AtomicU8::new(UNSET);

impl Isa {
    fn code(self) -> u8 {
        match self {
            Isa::Scalar => 1,
            Isa::Avx2 => 2,
            Isa::Avx512 => 3,
        }
    }

    fn from_code(code: u8) -> Isa {
        match code {
            3 => Isa::Avx512,
            2 => Isa::Avx2,
            _ => Isa::Scalar,
        }
    }

    /// Lower-case name as `WEFT_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a `WEFT_CPU_ISA` value.
    pub fn parse(value: &str) -> Result<Isa, OpError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            other => Err(OpError::Param {
                op: "cpu isa",
                message: format!("{ISA_ENV}={other:?} is not one of scalar, avx2, avx512"),
            }),
        }
    }

    /// The best path this CPU supports, ignoring the environment.
    pub fn best_supported() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vnni");
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx512 && avx2 {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Whether this CPU can run `self`.
    pub fn is_supported(self) -> bool {
        matches!(
            (self, Isa::best_supported()),
            (Isa::Scalar, _) | (Isa::Avx2, Isa::Avx2 | Isa::Avx512) | (Isa::Avx512, Isa::Avx512)
        )
    }

    /// The path kernels use by default: the one [`Isa::select`] chose, else
    /// the best supported one. Fixed at the first call.
    pub fn detect() -> Result<Isa, OpError> {
        let cached = DETECTED.load(Ordering::Relaxed);
        if cached != UNSET {
            return Ok(Isa::from_code(cached));
        }
        let isa = Isa::best_supported();
        match DETECTED.compare_exchange(UNSET, isa.code(), Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => Ok(isa),
            Err(other) => Ok(Isa::from_code(other)),
        }
    }

    /// Makes `self` the path of this process's kernels. An error when this
    /// CPU cannot run it, or when the kernels already run on another path
    /// (the choice is process-wide and made before the first kernel runs).
    pub fn select(self) -> Result<(), OpError> {
        let wanted = self.checked()?;
        match DETECTED.compare_exchange(UNSET, wanted.code(), Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(code) if code == wanted.code() => Ok(()),
            Err(code) => Err(OpError::Param {
                op: "cpu isa",
                message: format!(
                    "{ISA_ENV}={} was asked for, but the CPU kernels of this process already run on {}",
                    wanted.name(),
                    Isa::from_code(code).name()
                ),
            }),
        }
    }

    /// The path for a `WEFT_CPU_ISA` value (`None`: unset, the best this
    /// CPU supports). A value that is not valid UTF-8, not one of the
    /// names, or more than this CPU supports is an error naming the
    /// variable.
    pub fn from_env_value(value: Option<std::ffi::OsString>) -> Result<Isa, OpError> {
        let best = Isa::best_supported();
        let Some(value) = value else {
            return Ok(best);
        };
        let Some(text) = value.to_str() else {
            return Err(OpError::Param {
                op: "cpu isa",
                message: format!(
                    "{ISA_ENV}={value:?} is not valid UTF-8 (accepted: scalar, avx2, avx512)"
                ),
            });
        };
        let wanted = Isa::parse(text)?;
        if !wanted.is_supported() {
            return Err(OpError::Param {
                op: "cpu isa",
                message: format!(
                    "{ISA_ENV}={} but this CPU supports at most {}",
                    wanted.name(),
                    best.name()
                ),
            });
        }
        Ok(wanted)
    }

    /// `self`, or an error when this CPU cannot run it (for callers that
    /// pick a path explicitly).
    pub fn checked(self) -> Result<Isa, OpError> {
        if self.is_supported() {
            Ok(self)
        } else {
            Err(OpError::Param {
                op: "cpu isa",
                message: format!(
                    "the {} kernels need CPU features this machine lacks",
                    self.name()
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_values_are_named() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()).ok(), Some(isa));
        }
        let err = Isa::parse("sse9")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(ISA_ENV) && err.contains("sse9"), "{err}");
        assert!(Isa::Scalar.is_supported());
    }

    #[test]
    fn environment_values_are_strict() {
        assert_eq!(Isa::from_env_value(None).ok(), Some(Isa::best_supported()));
        assert_eq!(
            Isa::from_env_value(Some(" Scalar ".into())).ok(),
            Some(Isa::Scalar)
        );
        for bad in ["", "avx", "sse9"] {
            let err = Isa::from_env_value(Some(bad.into()))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(ISA_ENV), "{bad:?}: {err}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let raw = std::ffi::OsString::from_vec(vec![0xff, b'a']);
            let err = Isa::from_env_value(Some(raw))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(ISA_ENV) && err.contains("UTF-8"), "{err}");
        }
    }
}
