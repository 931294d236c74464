//! Parsers for numeric flags: every count has a range and every float a
//! meaningful interval, so a bad value is refused by the argument parser
//! (naming the flag) before any model is loaded.

/// The most tokens any context, prompt or generation may hold.
pub const MAX_TOKENS: u64 = 1 << 20;

/// An integer from `min` to `max`.
pub fn int_in<T>(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64>,
{
    move |text: &str| {
        let bad = || format!("`{text}` is not an integer from {min} to {max}");
        let n: u64 = text.trim().parse().map_err(|_| bad())?;
        if !(min..=max).contains(&n) {
            return Err(bad());
        }
        T::try_from(n).map_err(|_| bad())
    }
}

/// Worker threads: 1 to 1024, the rule `WEFT_THREADS` follows too.
pub fn threads(text: &str) -> Result<usize, String> {
    int_in(1, 1024)(text)
}

/// Layers per command buffer: 1 to 4096, as `WEFT_LAYERS_PER_CB`.
pub fn layers_per_cb(text: &str) -> Result<u32, String> {
    int_in(1, 4096)(text)
}

/// A token count from 0 to [`MAX_TOKENS`].
pub fn tokens(text: &str) -> Result<u32, String> {
    int_in(0, MAX_TOKENS)(text)
}

/// A token count from 1 to [`MAX_TOKENS`].
pub fn tokens_at_least_1(text: &str) -> Result<u32, String> {
    int_in(1, MAX_TOKENS)(text)
}

/// A finite number in `ok`, or an error saying it is not `accepts`.
fn float(text: &str, accepts: &str, ok: impl Fn(f32) -> bool) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(v) if v.is_finite() && ok(v) => Ok(v),
        _ => Err(format!("`{text}` is not {accepts}")),
    }
}

/// A sampling temperature: finite and at least 0 (0 is greedy).
pub fn temperature(text: &str) -> Result<f32, String> {
    float(text, "a finite number >= 0 (0: greedy)", |v| v >= 0.0)
}

/// A probability from 0 to 1 (top-p, min-p).
pub fn probability(text: &str) -> Result<f32, String> {
    float(text, "a number from 0 to 1", |v| (0.0..=1.0).contains(&v))
}

/// A repetition penalty: finite and above 0 (1 is off).
pub fn penalty(text: &str) -> Result<f32, String> {
    float(text, "a finite number > 0 (1: off)", |v| v > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_ranged() {
        assert_eq!(threads("8"), Ok(8));
        for bad in ["0", "1025", "-1", "x", "18446744073709551616"] {
            let e = threads(bad).unwrap_err();
            assert!(e.contains("1 to 1024"), "{e}");
        }
        assert_eq!(tokens("0"), Ok(0));
        assert!(tokens("4294967295").is_err());
        assert!(tokens_at_least_1("0").is_err());
    }

    #[test]
    fn floats_are_finite_and_in_range() {
        assert_eq!(temperature("0"), Ok(0.0));
        assert_eq!(temperature("1e-38"), Ok(1e-38));
        for bad in ["nan", "inf", "-inf", "-0.5", "1e39"] {
            assert!(temperature(bad).is_err(), "{bad}");
        }
        assert!(probability("1").is_ok() && probability("1.01").is_err());
        assert!(probability("nan").is_err() && probability("-0.1").is_err());
        assert!(penalty("1.1").is_ok());
        for bad in ["0", "-1", "nan", "inf"] {
            assert!(penalty(bad).is_err(), "{bad}");
        }
    }
}
