//! The CUDA C sources, compiled once per process and GPU architecture with
//! NVRTC, and the table of kernel functions loaded from them.
//!
//! Options: `--fmad=false` (the compiler never contracts a multiply and an
//! add: every fused multiply-add is written out where the CPU kernels fuse),
//! IEEE division and square root, no flush-to-zero.

use super::launch::driver_error;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use weft_ops::OpError;

/// The sources in dependency order (helpers first).
const SOURCES: [(&str, &str); 26] = [
    ("common.cu", include_str!("common.cu")),
    ("matmul.cu", include_str!("matmul.cu")),
    ("rows.cu", include_str!("rows.cu")),
    ("norm.cu", include_str!("norm.cu")),
    ("elementwise.cu", include_str!("elementwise.cu")),
    ("softmax.cu", include_str!("softmax.cu")),
    ("argmax.cu", include_str!("argmax.cu")),
    ("rope.cu", include_str!("rope.cu")),
    ("attention.cu", include_str!("attention.cu")),
    ("attn_decode.cu", include_str!("attn_decode.cu")),
    ("fused.cu", include_str!("fused.cu")),
    ("proj_attn.cu", include_str!("proj_attn.cu")),
    ("fast/attention.cu", include_str!("fast/attention.cu")),
    (
        "fast/attention_prefill.cu",
        include_str!("fast/attention_prefill.cu"),
    ),
    ("tail_rope.cu", include_str!("tail_rope.cu")),
    ("hyper.cu", include_str!("hyper.cu")),
    ("compress.cu", include_str!("compress.cu")),
    ("sink_attention.cu", include_str!("sink_attention.cu")),
    (
        "sink_attention_attend.cu",
        include_str!("sink_attention_attend.cu"),
    ),
    ("moe.cu", include_str!("moe.cu")),
    ("matmul_id.cu", include_str!("matmul_id.cu")),
    ("matmul_id_kquant.cu", include_str!("matmul_id_kquant.cu")),
    ("matmul_id_decode.cu", include_str!("matmul_id_decode.cu")),
    ("fast/matmul.cu", include_str!("fast/matmul.cu")),
    ("fast/matmul_id.cu", include_str!("fast/matmul_id.cu")),
    ("fast/matmul_half.cu", include_str!("fast/matmul_half.cu")),
];

/// The whole program, with `#line` markers so compiler messages name the file.
pub(crate) fn program_source() -> String {
    let mut src = String::new();
    for (name, text) in SOURCES {
        src.push_str(&format!("#line 1 \"{name}\"\n"));
        src.push_str(text);
        src.push('\n');
    }
    src
}

/// NVRTC options for `arch` (e.g. `sm_90`).
pub(crate) fn compile_options(arch: &str) -> CompileOptions {
    CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            "--diag-suppress=177".into(),
        ],
        ..Default::default()
    }
}

/// PTX per architecture, compiled at most once per process (and kept in
/// `disk_cache`, when given, between processes).
pub(crate) fn ptx_for(arch: &str, disk_cache: Option<&Path>) -> Result<Arc<str>, OpError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<str>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache
        .lock()
        .map_err(|_| driver_error("cuda", "PTX cache", "poisoned lock"))?;
    if let Some(p) = map.get(arch) {
        return Ok(p.clone());
    }
    let source = program_source();
    let cached = disk_cache.map(|dir| disk_cache_path(dir, &source, arch));
    if let Some(text) = cached
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        let text: Arc<str> = text.into();
        map.insert(arch.to_string(), text.clone());
        return Ok(text);
    }
    let ptx = compile_ptx_with_opts(source, compile_options(arch)).map_err(|e| {
        driver_error(
            "cuda",
            &format!("NVRTC compilation for {arch}"),
            describe(e),
        )
    })?;
    let text: Arc<str> = ptx.to_src().into();
    if let Some(path) = cached {
        // A cache that cannot be written only costs the next start a compile.
        let _ = std::fs::create_dir_all(path.parent().unwrap_or(std::path::Path::new(".")))
            .and_then(|_| std::fs::write(&path, text.as_bytes()));
    }
    map.insert(arch.to_string(), text.clone());
    Ok(text)
}

/// `<dir>/<hash of source, options and arch>.ptx`.
fn disk_cache_path(dir: &Path, source: &str, arch: &str) -> PathBuf {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let opts = format!("{:?}", compile_options(arch));
    for b in source.bytes().chain(opts.bytes()).chain(arch.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    dir.join(format!("weft-{arch}-{h:016x}.ptx"))
}

/// The compiler's log, readable.
fn describe(e: cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            format!("{nvrtc:?}: {}", log.to_string_lossy())
        }
        other => format!("{other:?}"),
    }
}

/// Every kernel of the program, by name.
pub(crate) struct Functions {
    map: HashMap<&'static str, CudaFunction>,
    /// The device's compute capability (major version), read once at load.
    pub(crate) major: i32,
}

impl Functions {
    /// Compiles (or reuses, from this process or `ptx_cache`) the program
    /// for `ctx`'s device and loads `names`.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        names: &[&'static str],
        ptx_cache: Option<&Path>,
    ) -> Result<Self, OpError> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error("cuda", "reading the compute capability", e))?;
        let arch = format!("sm_{major}{minor}");
        // Programmatic dependent launch needs sm_90 (pdl_sync compiles to
        // nothing below it).
        super::launch::note_compute_capability(major);
        let ptx = ptx_for(&arch, ptx_cache)?;
        let module = ctx
            .load_module(Ptx::from_src(ptx.to_string()))
            .map_err(|e| driver_error("cuda", "loading the compiled module", e))?;
        let mut map = HashMap::new();
        for &name in names {
            let f = module
                .load_function(name)
                .map_err(|e| driver_error("cuda", &format!("loading kernel `{name}`"), e))?;
            map.insert(name, f);
        }
        Ok(Functions { map, major })
    }

    /// The kernel `name` (a name listed at load time).
    pub(crate) fn get(&self, op: &'static str, name: &str) -> Result<&CudaFunction, OpError> {
        self.map
            .get(name)
            .ok_or_else(|| driver_error(op, "kernel lookup", format!("no kernel `{name}`")))
    }
}
