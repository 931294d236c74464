//! Settings from the environment, parsed strictly.
//!
//! Precedence, lowest first: built-in defaults, then environment variables,
//! then command-line flags (a flag always wins). A variable that is set but
//! not valid UTF-8, out of range, or not one of the accepted values is an
//! error naming the variable and what it accepts; nothing is ignored
//! silently.

use std::ffi::OsString;
use weft_kernels::cpu::quant::{Isa, ISA_ENV};
use weft_runtime::Numerics;

/// Knobs that can come from the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `WEFT_THREADS`: worker threads, 1..=1024.
    pub threads: Option<usize>,
    /// `WEFT_REORDER`: 1 runs the reorder pass, 0 recorded order.
    pub reorder: Option<bool>,
    /// `WEFT_LAYERS_PER_CB`: layers per command buffer, 1..=4096.
    pub layers_per_cb: Option<u32>,
    /// `WEFT_PREFILL_WINDOWS`: prefill chunk size in windows, 1..=4096.
    pub prefill_windows: Option<u32>,
    /// `WEFT_GRAPH_DIAG`: 1 prints one line per command buffer.
    pub graph_diag: Option<bool>,
    /// `WEFT_FUSE`: 0 turns the fusion pass off.
    pub fuse: Option<bool>,
    /// `WEFT_NUMERICS`: exact or fast.
    pub numerics: Option<Numerics>,
}

/// A malformed setting.
#[derive(Debug, thiserror::Error)]
#[error("[weft settings] {var}={value:?} is not valid: {accepts}")]
pub struct SettingsError {
    pub var: &'static str,
    pub value: String,
    pub accepts: std::borrow::Cow<'static, str>,
}

/// How a variable outside [`Settings`] is checked.
enum Rule {
    /// One of these strings, exactly (the reader does not trim).
    Exact(&'static [&'static str]),
    /// One of these strings after trimming white space.
    Trimmed(&'static [&'static str]),
    /// An integer in the range, after trimming white space.
    Range(u64, u64),
    /// A non-empty path.
    Path,
}

/// The variables read outside [`Settings`], with what their readers
/// accept: the model fetch and the CUDA backend (checked by name and value
/// whatever the build, so a CPU-only run refuses a bad value too).
const OTHER_VARS: &[(&str, Rule, &str)] = &[
    ("WEFT_CACHE", Rule::Path, "a non-empty folder path"),
    (
        "WEFT_PYTHON",
        Rule::Path,
        "a non-empty path to a Python 3 interpreter",
    ),
    ("WEFT_CUDA_GRAPHS", Rule::Trimmed(&["0", "1"]), "0 or 1"),
    ("WEFT_CUDA_GROUP", Rule::Trimmed(&["0", "1"]), "0 or 1"),
    (
        "WEFT_CUDA_STREAMS",
        Rule::Range(1, 4),
        "an integer from 1 to 4",
    ),
    ("WEFT_CUDA_PTX_CACHE", Rule::Path, "a non-empty folder path"),
    (
        "WEFT_CUDA_F64_SUM",
        Rule::Exact(&["auto", "bounded", "sequential", "parallel"]),
        "one of auto, bounded, sequential, parallel",
    ),
    (
        "WEFT_CUDA_MATVEC_ROWS",
        Rule::Exact(&["staged", "direct"]),
        "staged or direct",
    ),
    (
        "WEFT_CUDA_MATVEC_BLOCK_ROWS",
        Rule::Exact(&["8", "16", "32"]),
        "8, 16 or 32",
    ),
    (
        "WEFT_CUDA_PROJ_ATTENTION",
        Rule::Exact(&["0", "1"]),
        "0 or 1",
    ),
    (
        "WEFT_CUDA_ATTN_STAGING",
        Rule::Exact(&["auto", "direct"]),
        "auto or direct",
    ),
    ("WEFT_CUDA_PDL", Rule::Exact(&["0", "1"]), "0 or 1"),
    (
        "WEFT_CUDA_ROPE_POSITIONS",
        Rule::Range(1, u32::MAX as u64),
        "a positive integer (positions per rope table)",
    ),
];

/// The variables [`Settings`] reads.
pub const SETTINGS_VARS: [&str; 7] = [
    "WEFT_THREADS",
    "WEFT_REORDER",
    "WEFT_LAYERS_PER_CB",
    "WEFT_PREFILL_WINDOWS",
    "WEFT_GRAPH_DIAG",
    "WEFT_FUSE",
    "WEFT_NUMERICS",
];

/// Every variable a user can set, as [`check_environment`] checks them.
pub fn variables() -> Vec<&'static str> {
    let mut all = SETTINGS_VARS.to_vec();
    all.push(ISA_ENV);
    all.extend(OTHER_VARS.iter().map(|(var, _, _)| *var));
    all
}

/// Checks every `WEFT_*` variable a user can set, in the process
/// environment: [`Settings`], `WEFT_CPU_ISA` (also against this CPU), the
/// model fetch's and the CUDA backend's. The command line calls this at
/// start-up, before any work.
pub fn check_environment() -> Result<Settings, SettingsError> {
    check_vars(|k| std::env::var_os(k))
}

/// [`check_environment`] reading variables through `get`.
pub fn check_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Settings, SettingsError> {
    let settings = Settings::from_vars(&get)?;
    let isa = "scalar, avx2 or avx512";
    if let Some(value) = text(&get, ISA_ENV, isa)? {
        let accepts = match Isa::parse(&value) {
            Err(_) => Some(isa.into()),
            Ok(wanted) if !wanted.is_supported() => Some(
                format!(
                    "{isa}, and this CPU supports at most {}",
                    Isa::best_supported().name()
                )
                .into(),
            ),
            Ok(_) => None,
        };
        if let Some(accepts) = accepts {
            return Err(SettingsError {
                var: ISA_ENV,
                value,
                accepts,
            });
        }
    }
    for (var, rule, accepts) in OTHER_VARS {
        let Some(value) = text(&get, var, accepts)? else {
            continue;
        };
        let ok = match rule {
            Rule::Exact(names) => names.contains(&value.as_str()),
            Rule::Trimmed(names) => names.contains(&value.trim()),
            Rule::Range(min, max) => value
                .trim()
                .parse::<u64>()
                .is_ok_and(|n| (*min..=*max).contains(&n)),
            Rule::Path => !value.trim().is_empty(),
        };
        if !ok {
            return Err(SettingsError {
                var,
                value,
                accepts: (*accepts).into(),
            });
        }
    }
    Ok(settings)
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Self::from_vars(|k| std::env::var_os(k))
    }

    /// Reads variables through `get` (testable without touching the environment).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Settings, SettingsError> {
        Ok(Settings {
            threads: number(&get, "WEFT_THREADS", 1, 1024, "an integer from 1 to 1024")?,
            reorder: flag(&get, "WEFT_REORDER")?,
            layers_per_cb: number(
                &get,
                "WEFT_LAYERS_PER_CB",
                1,
                4096,
                "an integer from 1 to 4096",
            )?,
            prefill_windows: number(
                &get,
                "WEFT_PREFILL_WINDOWS",
                1,
                4096,
                "an integer from 1 to 4096",
            )?,
            graph_diag: flag(&get, "WEFT_GRAPH_DIAG")?,
            fuse: flag(&get, "WEFT_FUSE")?,
            numerics: numerics(&get)?,
        })
    }

    /// `self` with every setting `over` has replacing it.
    pub fn overlay(self, over: &Settings) -> Settings {
        Settings {
            threads: over.threads.or(self.threads),
            reorder: over.reorder.or(self.reorder),
            layers_per_cb: over.layers_per_cb.or(self.layers_per_cb),
            prefill_windows: over.prefill_windows.or(self.prefill_windows),
            graph_diag: over.graph_diag.or(self.graph_diag),
            fuse: over.fuse.or(self.fuse),
            numerics: over.numerics.or(self.numerics),
        }
    }
}

fn text(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &'static str,
    accepts: &'static str,
) -> Result<Option<String>, SettingsError> {
    match get(var) {
        None => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|raw| SettingsError {
            var,
            value: raw.to_string_lossy().into_owned(),
            accepts: format!("{accepts} (valid UTF-8)").into(),
        }),
    }
}

fn flag(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &'static str,
) -> Result<Option<bool>, SettingsError> {
    let accepts = "0 or 1";
    match text(get, var, accepts)?.as_deref().map(str::trim) {
        None => Ok(None),
        Some("1") => Ok(Some(true)),
        Some("0") => Ok(Some(false)),
        Some(other) => Err(SettingsError {
            var,
            value: other.to_string(),
            accepts: accepts.into(),
        }),
    }
}

fn numerics(get: &impl Fn(&str) -> Option<OsString>) -> Result<Option<Numerics>, SettingsError> {
    let (var, accepts) = ("WEFT_NUMERICS", "exact or fast");
    match text(get, var, accepts)? {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| SettingsError {
            var,
            value: v,
            accepts: accepts.into(),
        }),
    }
}

fn number<T: TryFrom<u64>>(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &'static str,
    min: u64,
    max: u64,
    accepts: &'static str,
) -> Result<Option<T>, SettingsError> {
    let Some(raw) = text(get, var, accepts)? else {
        return Ok(None);
    };
    let bad = || SettingsError {
        var,
        value: raw.clone(),
        accepts: accepts.into(),
    };
    let n: u64 = raw.trim().parse().map_err(|_| bad())?;
    if !(min..=max).contains(&n) {
        return Err(bad());
    }
    T::try_from(n).map(Some).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    /// docs/settings.md's first table lists exactly the variables the
    /// command line checks, and `Settings` reads every name it claims to.
    #[test]
    fn the_settings_table_matches_the_code() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md"))
            .expect("docs/settings.md");
        let first_table = doc.split("\n## ").next().unwrap_or("");
        let listed: BTreeSet<&str> = first_table
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .filter(|v| v.starts_with("WEFT_"))
            .collect();
        let code: BTreeSet<&str> = variables().into_iter().collect();
        assert_eq!(listed, code, "docs/settings.md against src/settings.rs");
        for var in SETTINGS_VARS {
            let e = Settings::from_vars(vars(&[(var, "\u{1}bad")]));
            assert!(e.is_err(), "{var} is not read by Settings");
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn valid_values_parse_and_flags_win() {
        let s = Settings::from_vars(vars(&[
            ("WEFT_THREADS", "2"),
            ("WEFT_REORDER", "0"),
            ("WEFT_LAYERS_PER_CB", " 4 "),
            ("WEFT_GRAPH_DIAG", "1"),
        ]))
        .unwrap();
        assert_eq!(s.threads, Some(2));
        assert_eq!(s.reorder, Some(false));
        assert_eq!(s.layers_per_cb, Some(4));
        assert_eq!(s.graph_diag, Some(true));
        let flags = Settings {
            threads: Some(1),
            ..Default::default()
        };
        assert_eq!(s.overlay(&flags).threads, Some(1));
    }

    #[test]
    fn malformed_values_name_the_variable_and_what_it_accepts() {
        for (var, value, accepts) in [
            ("WEFT_REORDER", "yes", "0 or 1"),
            ("WEFT_THREADS", "0", "1 to 1024"),
            ("WEFT_THREADS", "-3", "1 to 1024"),
            ("WEFT_LAYERS_PER_CB", "many", "1 to 4096"),
            ("WEFT_PREFILL_WINDOWS", "99999", "1 to 4096"),
            ("WEFT_GRAPH_DIAG", "", "0 or 1"),
            ("WEFT_NUMERICS", "quick", "exact or fast"),
        ] {
            let e = Settings::from_vars(vars(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(var) && e.contains(accepts), "{e}");
        }
    }

    #[test]
    fn other_variables_are_checked_by_name_and_value() {
        for (var, value) in [
            ("WEFT_CPU_ISA", "sse9"),
            ("WEFT_CPU_ISA", ""),
            ("WEFT_PYTHON", ""),
            ("WEFT_PYTHON", "  "),
            ("WEFT_CACHE", ""),
            ("WEFT_CUDA_GRAPHS", "2"),
            ("WEFT_CUDA_STREAMS", "5"),
            ("WEFT_CUDA_STREAMS", "0"),
            ("WEFT_CUDA_F64_SUM", "fast"),
            ("WEFT_CUDA_F64_SUM", " auto"),
            ("WEFT_CUDA_MATVEC_BLOCK_ROWS", "12"),
            ("WEFT_CUDA_PDL", "yes"),
            ("WEFT_CUDA_PTX_CACHE", ""),
            ("WEFT_CUDA_ROPE_POSITIONS", "0"),
        ] {
            let e = check_vars(vars(&[(var, value)])).unwrap_err().to_string();
            assert!(e.contains(var), "{var}={value:?}: {e}");
        }
        for (var, value) in [
            ("WEFT_CPU_ISA", "scalar"),
            ("WEFT_PYTHON", "/usr/bin/python3"),
            ("WEFT_CUDA_GRAPHS", " 0 "),
            ("WEFT_CUDA_STREAMS", "4"),
            ("WEFT_CUDA_F64_SUM", "parallel"),
            ("WEFT_CUDA_MATVEC_BLOCK_ROWS", "32"),
            ("WEFT_CUDA_ROPE_POSITIONS", "8192"),
        ] {
            assert!(check_vars(vars(&[(var, value)])).is_ok(), "{var}={value:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_is_an_error() {
        use std::os::unix::ffi::OsStringExt;
        let get = |k: &str| (k == "WEFT_THREADS").then(|| OsString::from_vec(vec![0xff, 0x32]));
        let e = Settings::from_vars(get).unwrap_err().to_string();
        assert!(e.contains("WEFT_THREADS"), "{e}");
    }
}
