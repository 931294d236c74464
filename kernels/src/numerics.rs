//! The numerics mode: whether kernels keep one fixed floating-point order
//! or may reorder work for speed. One mode holds for a whole executor; model
//! code, the fusion pass and the schedule are the same in both.

use std::fmt;
use std::str::FromStr;

/// How kernels may order floating-point work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Every kernel keeps one fixed float order: the CPU's reproduces
    /// llama.cpp's x86 arithmetic, CUDA's the CPU's, bit for bit. The
    /// verification mode every fast kernel is judged against.
    #[default]
    Exact,
    /// Kernels may reorder floating-point work (attention split over the
    /// cached cells and combined by log-sum-exp, parallel reductions). Each
    /// fast kernel states its error bound; a kernel without a fast variant
    /// runs its exact one. Results still do not depend on the thread count.
    Fast,
}

impl Numerics {
    /// Every mode, in the order the command line lists them.
    pub const ALL: [Numerics; 2] = [Numerics::Exact, Numerics::Fast];

    /// The name `--numerics` and `WEFT_NUMERICS` take.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Fast => "fast",
        }
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a numerics mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a numerics mode (exact or fast)")]
pub struct UnknownNumerics(pub String);

impl FromStr for Numerics {
    type Err = UnknownNumerics;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Numerics::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
            .ok_or_else(|| UnknownNumerics(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for m in Numerics::ALL {
            assert_eq!(m.name().parse::<Numerics>(), Ok(m));
        }
        assert!("Fast ".to_lowercase().parse::<Numerics>().is_ok());
        assert!("quick".parse::<Numerics>().is_err());
        assert_eq!(Numerics::default(), Numerics::Exact);
    }
}
