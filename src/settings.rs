//! Settings from the environment, parsed strictly.
//!
//! Precedence, lowest first: built-in defaults, then environment variables,
//! then command-line flags (a flag always wins). A variable that is set but
//! not valid UTF-8, out of range, or not one of the accepted values is an
//! error naming the variable and what it accepts; nothing is ignored
//! silently.

use std::ffi::OsString;
use std::path::PathBuf;
use weft_kernels::cpu::quant::{Isa, ISA_ENV};
use weft_models::fetch::{FetchConfig, FetchError};
use weft_runtime::{CudaConfig, ExecutorConfig, Numerics};

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
    /// `WEFT_CPU_ISA`: scalar, avx2 or avx512 (at most what this CPU has).
    pub cpu_isa: Option<Isa>,
    /// `WEFT_CUDA_GRAPHS`: 0 launches eagerly, 1 captures CUDA graphs.
    pub cuda_graphs: Option<bool>,
    /// `WEFT_CUDA_STREAMS`: streams per level, 1..=4.
    pub cuda_streams: Option<usize>,
    /// `WEFT_CUDA_PTX_CACHE`: a folder keeping compiled kernels.
    pub cuda_ptx_cache: Option<PathBuf>,
}

/// A malformed setting.
#[derive(Debug, thiserror::Error)]
#[error("[weft settings] {var}={value:?} is not valid: {accepts}")]
pub struct SettingsError {
    pub var: &'static str,
    pub value: String,
    pub accepts: std::borrow::Cow<'static, str>,
}

/// The variables read outside [`Settings`] (by the model fetch, paths
/// that must not be empty), with what their reader accepts.
const OTHER_VARS: &[(&str, &str)] = &[
    ("WEFT_CACHE", "a non-empty folder path"),
    ("WEFT_PYTHON", "a non-empty path to a Python 3 interpreter"),
];

/// Variables weft no longer reads, with what happens instead: setting one
/// is an error, so a switch that has no effect is not mistaken for one
/// that does. Each chose between kernel variants of the same bits; the
/// measured fastest is the only one left.
const RETIRED_VARS: &[(&str, &str)] = &[
    (
        "WEFT_CUDA_GROUP",
        "a level's decode matvecs of one activation row always share one launch",
    ),
    (
        "WEFT_CUDA_MATVEC_ROWS",
        "grouped decode matvecs always stage their weight rows where they fit",
    ),
    (
        "WEFT_CUDA_MATVEC_BLOCK_ROWS",
        "staged grouped decode matvecs always take 16 rows per block",
    ),
    (
        "WEFT_CUDA_PROJ_ATTENTION",
        "a decode step's q/k/v projections are always fused into its attention where supported",
    ),
    (
        "WEFT_CUDA_ATTN_STAGING",
        "the tiled prefill attention always stages f16 tiles where shared memory allows",
    ),
    (
        "WEFT_CUDA_F64_SUM",
        "norms and softmax always reproduce the CPU's f64 sums by the bounded method",
    ),
    (
        "WEFT_CUDA_PDL",
        "programmatic dependent launch is always on where the device has it",
    ),
    (
        "WEFT_CUDA_ROPE_POSITIONS",
        "rope tables always cover 32768 positions",
    ),
];

/// The variables [`Settings`] reads.
pub const SETTINGS_VARS: [&str; 11] = [
    "WEFT_THREADS",
    "WEFT_REORDER",
    "WEFT_LAYERS_PER_CB",
    "WEFT_PREFILL_WINDOWS",
    "WEFT_GRAPH_DIAG",
    "WEFT_FUSE",
    "WEFT_NUMERICS",
    ISA_ENV,
    "WEFT_CUDA_GRAPHS",
    "WEFT_CUDA_STREAMS",
    "WEFT_CUDA_PTX_CACHE",
];

/// Where models are cached and which Python fetches them, from the process
/// environment (`WEFT_CACHE`, `XDG_CACHE_HOME`, `HOME`, `WEFT_PYTHON`).
pub fn fetch_config() -> Result<FetchConfig, FetchError> {
    FetchConfig::from_vars(|k| std::env::var_os(k))
}

/// Every variable a user can set, as [`check_environment`] checks them.
pub fn variables() -> Vec<&'static str> {
    let mut all = SETTINGS_VARS.to_vec();
    all.extend(OTHER_VARS.iter().map(|(var, _)| *var));
    all
}

/// Checks every `WEFT_*` variable a user can set, in the process
/// environment: [`Settings`] (`WEFT_CPU_ISA` also against this CPU), the
/// model fetch's, and that no retired variable is set. The command line
/// calls this at start-up, before any work.
pub fn check_environment() -> Result<Settings, SettingsError> {
    check_vars(|k| std::env::var_os(k))
}

/// [`check_environment`] reading variables through `get`.
pub fn check_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Settings, SettingsError> {
    let settings = Settings::from_vars(&get)?;
    for (var, instead) in RETIRED_VARS {
        if let Some(value) = get(var) {
            return Err(SettingsError {
                var,
                value: value.to_string_lossy().into_owned(),
                accepts: format!("nothing: the variable was removed ({instead}); unset it").into(),
            });
        }
    }
    for (var, accepts) in OTHER_VARS {
        if let Some(value) = text(&get, var, accepts)? {
            if value.trim().is_empty() {
                return Err(SettingsError {
                    var,
                    value,
                    accepts: (*accepts).into(),
                });
            }
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
            cpu_isa: cpu_isa(&get)?,
            cuda_graphs: flag(&get, "WEFT_CUDA_GRAPHS")?,
            cuda_streams: number(
                &get,
                "WEFT_CUDA_STREAMS",
                1,
                CudaConfig::MAX_STREAMS as u64,
                "an integer from 1 to 4",
            )?,
            cuda_ptx_cache: path(&get, "WEFT_CUDA_PTX_CACHE", "a non-empty folder path")?,
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
            cpu_isa: over.cpu_isa.or(self.cpu_isa),
            cuda_graphs: over.cuda_graphs.or(self.cuda_graphs),
            cuda_streams: over.cuda_streams.or(self.cuda_streams),
            cuda_ptx_cache: over.cuda_ptx_cache.clone().or(self.cuda_ptx_cache),
        }
    }

    /// The executor configuration: the defaults with every setting given
    /// here replacing its field.
    pub fn executor_config(&self) -> ExecutorConfig {
        let mut config = ExecutorConfig::default();
        if let Some(t) = self.threads {
            config.threads = t;
        }
        if let Some(r) = self.reorder {
            config.reorder = r;
        }
        if let Some(k) = self.layers_per_cb {
            config.cut.layers_per_cb = Some(k);
        }
        if let Some(d) = self.graph_diag {
            config.diagnostics.graph_diag = d;
        }
        if let Some(f) = self.fuse {
            config.fuse = f;
        }
        if let Some(n) = self.numerics {
            config.numerics = n;
        }
        config.cpu.isa = self.cpu_isa;
        if let Some(g) = self.cuda_graphs {
            config.cuda.graphs = g;
        }
        if let Some(n) = self.cuda_streams {
            config.cuda.streams = n;
        }
        config.cuda.ptx_cache = self.cuda_ptx_cache.clone();
        config
    }
}

fn cpu_isa(get: &impl Fn(&str) -> Option<OsString>) -> Result<Option<Isa>, SettingsError> {
    let accepts = "scalar, avx2 or avx512";
    let Some(value) = text(get, ISA_ENV, accepts)? else {
        return Ok(None);
    };
    match Isa::parse(&value) {
        Err(_) => Err(SettingsError {
            var: ISA_ENV,
            value,
            accepts: accepts.into(),
        }),
        Ok(wanted) if !wanted.is_supported() => Err(SettingsError {
            var: ISA_ENV,
            value,
            accepts: format!(
                "{accepts}, and this CPU supports at most {}",
                Isa::best_supported().name()
            )
            .into(),
        }),
        Ok(wanted) => Ok(Some(wanted)),
    }
}

fn path(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &'static str,
    accepts: &'static str,
) -> Result<Option<PathBuf>, SettingsError> {
    match text(get, var, accepts)? {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Err(SettingsError {
            var,
            value: v,
            accepts: accepts.into(),
        }),
        Some(v) => Ok(Some(PathBuf::from(v))),
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
            let e = Settings::from_vars(vars(&[(var, "")]));
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
            ("WEFT_CUDA_PTX_CACHE", ""),
            ("WEFT_CUDA_PTX_CACHE", " "),
        ] {
            let e = check_vars(vars(&[(var, value)])).unwrap_err().to_string();
            assert!(e.contains(var), "{var}={value:?}: {e}");
        }
        for (var, value) in [
            ("WEFT_CPU_ISA", "scalar"),
            ("WEFT_PYTHON", "/usr/bin/python3"),
            ("WEFT_CUDA_GRAPHS", " 0 "),
            ("WEFT_CUDA_STREAMS", "4"),
            ("WEFT_CUDA_PTX_CACHE", "/tmp/ptx"),
        ] {
            assert!(check_vars(vars(&[(var, value)])).is_ok(), "{var}={value:?}");
        }
    }

    /// A retired switch is refused whatever its value (it would have no
    /// effect), naming the variable and saying what happens instead.
    #[test]
    fn retired_variables_are_errors() {
        for (var, _) in RETIRED_VARS {
            for value in ["0", "1", "auto"] {
                let e = check_vars(vars(&[(var, value)])).unwrap_err().to_string();
                assert!(e.contains(var) && e.contains("removed"), "{e}");
            }
            assert!(!variables().contains(var), "{var} is both read and retired");
        }
    }

    /// Every setting reaches its field of the executor configuration; the
    /// fields no setting names keep their defaults.
    #[test]
    fn settings_fill_the_executor_config() {
        let s = Settings::from_vars(vars(&[
            ("WEFT_THREADS", "3"),
            ("WEFT_REORDER", "0"),
            ("WEFT_LAYERS_PER_CB", "2"),
            ("WEFT_GRAPH_DIAG", "1"),
            ("WEFT_FUSE", "0"),
            ("WEFT_NUMERICS", "fast"),
            ("WEFT_CPU_ISA", "scalar"),
            ("WEFT_CUDA_GRAPHS", "0"),
            ("WEFT_CUDA_STREAMS", "2"),
            ("WEFT_CUDA_PTX_CACHE", "/tmp/ptx"),
        ]))
        .unwrap();
        let c = s.executor_config();
        assert_eq!(c.threads, 3);
        assert!(!c.reorder && !c.fuse && c.diagnostics.graph_diag);
        assert_eq!(c.cut.layers_per_cb, Some(2));
        assert_eq!(c.numerics, Numerics::Fast);
        assert_eq!(c.cpu.isa, Some(Isa::Scalar));
        assert!(!c.cuda.graphs);
        assert_eq!(c.cuda.streams, 2);
        assert_eq!(c.cuda.ptx_cache, Some(PathBuf::from("/tmp/ptx")));
        let d = Settings::default().executor_config();
        assert_eq!(d, ExecutorConfig::default());
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
