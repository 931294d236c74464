//! Skip or fail: a test whose model, device or tool is missing passes with
//! a message saying why, unless the run requires it (`WEFT_TEST_REQUIRE_MODEL=1`
//! in CI, `WEFT_TEST_REQUIRE_CUDA=1` on the GPU machine, ...), where the skip is
//! a failure instead.

/// Real-model tests: fail when the model cannot be fetched.
pub const REQUIRE_MODEL: &str = "WEFT_TEST_REQUIRE_MODEL";
/// CUDA tests: fail without a usable GPU.
pub const REQUIRE_CUDA: &str = "WEFT_TEST_REQUIRE_CUDA";
/// Metal tests: fail without a Metal device.
pub const REQUIRE_METAL: &str = "WEFT_TEST_REQUIRE_METAL";
/// The HTML graph page test: fail without Chromium.
pub const REQUIRE_BROWSER: &str = "WEFT_TEST_REQUIRE_BROWSER";
/// The `weft serve` client test: fail without Python's `openai`.
pub const REQUIRE_OPENAI: &str = "WEFT_TEST_REQUIRE_OPENAI";

/// Whether `var` is set to `1`: what is missing fails the test.
pub fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// Says that the test skips because `why`, or panics with `why` when `var`
/// requires what is missing. The caller returns (passes) after it.
pub fn skip_or_fail(var: &str, why: &str) {
    if required(var) {
        panic!("{var}=1 but {why}");
    }
    eprintln!("skipping: {why}; set {var}=1 to fail instead");
}

/// `Some(value)`, or `None` after [`skip_or_fail`] when `found` is an error.
pub fn or_skip<T, E: std::fmt::Display>(var: &str, what: &str, found: Result<T, E>) -> Option<T> {
    match found {
        Ok(v) => Some(v),
        Err(e) => {
            skip_or_fail(var, &format!("{what} is not available ({e})"));
            None
        }
    }
}

/// The cached path of model `spec` (fetched on first use), or `None` after
/// [`skip_or_fail`] under [`REQUIRE_MODEL`] when it cannot be had.
pub fn model_path(spec: &weft_models::fetch::ModelSpec) -> Option<std::path::PathBuf> {
    let fetched = fetch_config().and_then(|config| {
        weft_models::fetch::ensure(spec, &config, &mut |msg| eprintln!("[fetch] {msg}"))
    });
    or_skip(REQUIRE_MODEL, &format!("the model {}", spec.name), fetched)
}

/// The model fetch's configuration from the test process's environment.
pub fn fetch_config() -> Result<weft_models::fetch::FetchConfig, weft_models::fetch::FetchError> {
    weft_models::fetch::FetchConfig::from_vars(|k| std::env::var_os(k))
}

/// Whether CUDA device 0 can run; without it, `false` after
/// [`skip_or_fail`] under [`REQUIRE_CUDA`].
pub fn cuda_or_skip() -> bool {
    match weft_runtime::Device::Cuda(0).unavailable_reason() {
        None => true,
        Some(why) => {
            skip_or_fail(REQUIRE_CUDA, &format!("CUDA is unavailable ({why})"));
            false
        }
    }
}

/// The CUDA settings a test executor takes: the defaults, with the folder
/// of compiled kernels that `WEFT_CUDA_PTX_CACHE` names (the device
/// scripts fill it, so a test process skips NVRTC's minutes of compiling).
pub fn cuda_config() -> weft_runtime::CudaConfig {
    weft_runtime::CudaConfig {
        ptx_cache: std::env::var_os("WEFT_CUDA_PTX_CACHE").map(std::path::PathBuf::from),
        ..Default::default()
    }
}
