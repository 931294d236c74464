//! Writing GGUF v3: metadata and tensors in, valid bytes out.
//!
//! The writer checks what the reader checks (no duplicate keys or tensor
//! names, 1 to 4 dimensions, whole quantization blocks, data size matching
//! the shape and type, a power-of-two alignment, bounded array nesting), so
//! anything it writes reads back. Tensor data is laid out in insertion order,
//! each tensor starting on the alignment and padded to it with zeros.
//!
//! ```
//! use weft_models::gguf::{GgufFile, GgufWriter};
//! use weft_ops::DType;
//!
//! let mut w = GgufWriter::new();
//! w.set("general.architecture", "llama")?;
//! w.set("llama.block_count", 2u32)?;
//! let weights: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! w.add_tensor("output_norm.weight", &[4], DType::F32, weights)?;
//! let file = GgufFile::from_bytes(w.to_bytes()?)?;
//! assert_eq!(file.require_u32("llama.block_count")?, 2);
//! # Ok::<(), weft_models::gguf::GgufError>(())
//! ```

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use weft_ops::DType;

use super::error::GgufError;
use super::reader::{
    align_up, tensor_bytes, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS,
};
use super::value::{Array, Value};

/// GGUF version the writer produces.
pub const WRITE_VERSION: u32 = 3;

/// A tensor waiting to be written; `data` may borrow (an existing map) or own.
struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    dtype: DType,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF v3 file. See the module docs for an example.
#[derive(Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor<'a>>,
}

impl std::fmt::Debug for GgufWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field(
                "metadata",
                &self
                    .metadata
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .field(
                "tensors",
                &self
                    .tensors
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty writer (alignment 32 unless `general.alignment` is set).
    pub fn new() -> GgufWriter<'a> {
        GgufWriter::default()
    }

    /// Adds metadata entry `key = value`; a key may be set once.
    /// `general.alignment` must be an integer power of two.
    pub fn set(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<&mut Self, GgufError> {
        let key = key.into();
        let value = value.into();
        if self.metadata.iter().any(|(k, _)| *k == key) {
            return Err(GgufError::writer(format!(
                "metadata key `{key}` is set twice"
            )));
        }
        if key == ALIGNMENT_KEY {
            check_alignment(&value)?;
        }
        if let Value::Array(a) = &value {
            let levels = nesting_levels(a);
            if levels > MAX_ARRAY_DEPTH {
                return Err(GgufError::writer(format!(
                    "metadata key `{key}`: arrays nested {levels} levels deep, more than the {MAX_ARRAY_DEPTH} the reader accepts"
                )));
            }
        }
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Sets `general.alignment` (as u32), replacing an earlier value.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self, GgufError> {
        check_alignment(&Value::U32(alignment))?;
        self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        self.set(ALIGNMENT_KEY, alignment)
    }

    /// The alignment tensor data will have.
    pub fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| v.as_integer())
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Adds a tensor. `dims` is in GGUF order (ne0 first); `data` must be
    /// exactly the bytes the shape and type call for.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        dtype: DType,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        let data = data.into();
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::writer(format!("tensor `{name}` is added twice")));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS as usize {
            return Err(GgufError::writer(format!(
                "tensor `{name}` has {} dimensions; GGUF allows 1 to {MAX_DIMS}",
                dims.len()
            )));
        }
        let bytes =
            tensor_bytes(&name, dims, dtype, 0).map_err(|e| GgufError::writer(e.to_string()))?;
        if data.len() as u64 != bytes {
            return Err(GgufError::writer(format!(
                "tensor `{name}` of shape {dims:?} and type {dtype} needs {bytes} bytes of data, got {}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            dtype,
            data,
        });
        Ok(self)
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes the file to `out`. `name` in errors is `<stream>`.
    pub fn write_to(&self, out: &mut impl Write) -> Result<(), GgufError> {
        self.write_named(out, Path::new("<stream>"))
    }

    /// Writes the file at `path` atomically: to `<path>.tmp`, then renamed.
    pub fn write_file(&self, path: &Path) -> Result<(), GgufError> {
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp_name);
        let io = |source| GgufError::Io {
            path: tmp.clone(),
            source,
        };
        let result = (|| {
            let file = std::fs::File::create(&tmp).map_err(io)?;
            let mut buffered = std::io::BufWriter::new(file);
            self.write_named(&mut buffered, &tmp)?;
            let file = buffered.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&tmp, path).map_err(|source| GgufError::Io {
                path: path.to_path_buf(),
                source,
            })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn write_named(&self, out: &mut impl Write, path: &Path) -> Result<(), GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let alignment = self.alignment();
        let header = self.header(alignment)?;
        out.write_all(&header).map_err(io)?;
        for t in &self.tensors {
            out.write_all(&t.data).map_err(io)?;
            let padded = align_up(t.data.len() as u64, alignment).unwrap_or_default();
            write_zeros(out, padded.saturating_sub(t.data.len() as u64)).map_err(io)?;
        }
        out.flush().map_err(io)
    }

    /// Header, metadata, tensor infos and the padding up to the data section.
    fn header(&self, alignment: u64) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.ggml_id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = offset
                .checked_add(t.data.len() as u64)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| {
                    GgufError::writer(format!("tensor data overflows after `{}`", t.name))
                })?;
        }
        let data_offset = align_up(out.len() as u64, alignment).unwrap_or_default();
        out.resize(data_offset as usize, 0);
        Ok(out)
    }
}

fn check_alignment(value: &Value) -> Result<(), GgufError> {
    match value.as_integer().and_then(|v| u64::try_from(v).ok()) {
        Some(a) if a.is_power_of_two() => Ok(()),
        _ => Err(GgufError::writer(format!(
            "`{ALIGNMENT_KEY}` = {value} ({}) must be a nonzero power of two",
            value.type_description()
        ))),
    }
}

/// How many array levels the reader will see: an array of arrays counts one
/// more than its deepest element (an empty one still declares arrays inside).
fn nesting_levels(array: &Array) -> usize {
    match array {
        Array::Array(inner) => 1 + inner.iter().map(nesting_levels).max().unwrap_or(1),
        _ => 1,
    }
}

/// Writes `n` zero bytes without allocating them all at once.
fn write_zeros(out: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let chunk = n.min(ZEROS.len() as u64);
        out.write_all(ZEROS.get(..chunk as usize).unwrap_or(&[]))?;
        n -= chunk;
    }
    Ok(())
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, array: &Array) {
    out.extend_from_slice(&array.element_type_id().to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    match array {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => v.iter().for_each(|&x| out.push(u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        Array::U64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
    }
}
