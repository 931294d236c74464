//! GGUF files (versions 2 and 3): a validating reader on `memmap2` and a
//! writer.
//!
//! - [`GgufFile`] opens a file (memory-mapped) or takes bytes, validates the
//!   whole layout up front, and then answers metadata and tensor questions
//!   without further checks. Tensor data is never copied: [`GgufFile::tensor_data`]
//!   borrows from the map, and [`GgufFile::shared_bytes`] hands out a cheap,
//!   `'static` handle to it for code that outlives the `GgufFile`.
//! - [`GgufWriter`] builds GGUF v3 bytes from metadata and tensors (tests,
//!   tiny random-weight models).
//!
//! Files: `reader.rs` parses and validates, `access.rs` holds the typed
//! metadata accessors, `value.rs` the value types, `writer.rs` the writer,
//! `error.rs` the error type, `guard.rs` the SIGBUS handler naming a mapped
//! file truncated under the map.
//!
//! Layout reminder: `GGUF` magic, u32 version, u64 tensor count, u64 metadata
//! count, metadata entries (string key, u32 type, value), tensor infos (string
//! name, u32 dimension count, u64 dimensions with ne0 first, u32 ggml type, u64
//! offset relative to the data section), padding to the alignment, tensor data.

mod access;
mod error;
mod guard;
mod reader;
mod value;
pub mod writer;

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use weft_ops::DType;

pub use error::GgufError;
pub use guard::{install_truncation_guard, TRUNCATED_EXIT_CODE};
pub use reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use value::{type_id, type_name, Array, Value};
pub use writer::GgufWriter;

/// One tensor as the file describes it, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the innermost (contiguous) dimension, ne0.
    pub dims: Vec<u64>,
    pub dtype: DType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte size of the data.
    pub bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of the dimensions).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Where the file bytes live. A map's registration with the truncation
/// guard is dropped (unregistered) before the map itself.
enum Source {
    Mapped {
        _registration: guard::Registration,
        map: memmap2::Mmap,
    },
    Owned(Vec<u8>),
}

/// A cheap, cloneable, thread-safe handle to a GGUF file's bytes (the map
/// stays alive while any handle does). Derefs to the whole file.
#[derive(Clone)]
pub struct GgufBytes(Arc<Source>);

impl Deref for GgufBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &*self.0 {
            Source::Mapped { map, .. } => map,
            Source::Owned(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for GgufBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgufBytes({} bytes)", self.len())
    }
}

/// A validated GGUF file.
pub struct GgufFile {
    bytes: GgufBytes,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_offsets: Vec<u64>,
    key_index: Vec<usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: Vec<usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("bytes", &self.bytes.len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and validates the file at `path`.
    ///
    /// The file must not be modified while it is open (see the safety note
    /// on the map): weft maps model files read-only and never writes them.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // mmap of an empty file fails on some systems; the parser gives the
            // proper "truncated magic" error instead.
            return GgufFile::from_bytes(Vec::new());
        }
        // SAFETY: the map is read-only and private to this process. Mapping a
        // file is only unsound if another process truncates or rewrites it
        // while mapped; model files are treated as immutable (weft's own
        // fetch writes them once, atomically, under a temporary name), which
        // is the same contract every mmap-based model loader relies on. A
        // truncation then raises SIGBUS, which the truncation guard (once
        // installed) turns into an error message naming the file.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let registration = guard::register(path, map.as_ptr(), map.len());
        GgufFile::from_source(Source::Mapped {
            _registration: registration,
            map,
        })
    }

    /// Validates GGUF bytes held in memory (tests, fuzzing, generated models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::from_source(Source::Owned(bytes))
    }

    fn from_source(source: Source) -> Result<GgufFile, GgufError> {
        let bytes = GgufBytes(Arc::new(source));
        let parsed = reader::parse(&bytes)?;
        Ok(GgufFile {
            bytes,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            key_offsets: parsed.key_offsets,
            key_index: parsed.key_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        })
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entry(key).map(|(value, _)| value)
    }

    /// The value of `key` and the byte offset of its entry.
    pub(crate) fn entry(&self, key: &str) -> Option<(&Value, u64)> {
        let i = self.lookup(&self.key_index, key, |i| {
            self.metadata.get(i).map(|(k, _)| k.as_str())
        })?;
        let (_, value) = self.metadata.get(i)?;
        Some((value, self.key_offsets.get(i).copied().unwrap_or_default()))
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = self.lookup(&self.tensor_index, name, |i| {
            self.tensors.get(i).map(|t| t.name.as_str())
        })?;
        self.tensors.get(i)
    }

    /// The exact bytes of tensor `t`. A `TensorInfo` that did not come from
    /// this file and lies outside it gives an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.bytes).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        range.and_then(|r| self.bytes.get(r)).unwrap_or(&[])
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A `'static` handle to the whole file, for weights that outlive this
    /// `GgufFile` (a CPU backend reading straight from the map).
    pub fn shared_bytes(&self) -> GgufBytes {
        self.bytes.clone()
    }

    /// Binary search of a name in an index sorted by name.
    fn lookup<'a>(
        &'a self,
        index: &[usize],
        name: &str,
        name_of: impl Fn(usize) -> Option<&'a str>,
    ) -> Option<usize> {
        let pos = index
            .binary_search_by(|&i| name_of(i).unwrap_or("").cmp(name))
            .ok()?;
        index.get(pos).copied()
    }
}
