//! Model identity: which weights and which cache layout a saved KV cache
//! belongs to.
//!
//! A KV checkpoint is only meaningful for the exact weights that computed
//! it and the exact layout of rows it holds, so it carries a
//! [`ModelIdentity`] and loads only where the identity matches. The
//! identity is defined here, once, so every front end (the CLI, a server)
//! derives the same value from the same model.
//!
//! # Definition (version 1)
//!
//! Encodings used below: `u32`/`u64` are little-endian; `str(s)` is the
//! byte length of `s` as `u64` followed by its UTF-8 bytes.
//!
//! The **GGUF digest** ([`GgufDigest::of`]) is the SHA-256 of:
//!
//! 1. the 20 bytes `b"weft gguf digest v1\0"`;
//! 2. the metadata entry count (`u64`), then every entry in file order:
//!    `str(key)`, the value's GGUF type id (`u32`) and its payload;
//! 3. the tensor count (`u64`), then every tensor in file order:
//!    `str(name)`, the dimension count (`u32`), each dimension (`u64`,
//!    ne0 first), the ggml type id (`u32`), the data length (`u64`) and
//!    the data bytes.
//!
//! A payload is: for an integer or float, its little-endian bytes at the
//! type's width (floats by their IEEE bits); for a bool, one byte 0 or 1;
//! for a string, `str(s)`; for an array, the element type id (`u32`), the
//! element count (`u64`) and each element's payload (an inner array is
//! again element type, count, payloads). This is GGUF v3's own encoding of
//! the header minus the tensor offsets, with the data inlined: padding and
//! where the data sits in the file do not count, every value and every
//! byte of every tensor does.
//!
//! The **model identity** ([`model_identity`]) is the SHA-256 of:
//!
//! 1. the 23 bytes `b"weft model identity v1\0"`;
//! 2. the 32 bytes of the GGUF digest;
//! 3. `str(architecture)` (`general.architecture`);
//! 4. the cache layout: the ggml type id of the K/V rows (`u32`), the
//!    layer count (`u64`), and per layer its width (`u64`, values per row)
//!    and window (`u32`, 0 for none).
//!
//! The context length and the chunk size are not part of it: rows are
//! saved by position, so a sequence continues in a cache of another
//! context (the loader checks that its position fits). A windowed layer's
//! ring size follows the chunk size, and the CPU attention sums in slot
//! order: in a cache of another chunk size the continuation is the same
//! maths rounded differently, not the same bits.
//!
//! Hashing reads every tensor byte (about 0.1 s per 100 MB);
//! [`crate::Model`] does it on first use and keeps the digest.

use crate::gguf::{Array, GgufError, GgufFile, Value};
use sha2::{Digest, Sha256};
use weft_runtime::cache::CacheConfig;
pub use weft_runtime::cache::ModelIdentity;

const GGUF_DOMAIN: &[u8; 20] = b"weft gguf digest v1\0";
const IDENTITY_DOMAIN: &[u8; 23] = b"weft model identity v1\0";

/// SHA-256 of a GGUF file's metadata, tensor infos and tensor data, as
/// defined in the module doc.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgufDigest(pub [u8; 32]);

impl std::fmt::Debug for GgufDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgufDigest(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

impl GgufDigest {
    /// The digest of `file`: reads every metadata value and tensor byte.
    pub fn of(file: &GgufFile) -> GgufDigest {
        let mut h = Sha256::new();
        h.update(GGUF_DOMAIN);
        h.update((file.metadata().len() as u64).to_le_bytes());
        for (key, value) in file.metadata() {
            put_str(&mut h, key);
            h.update(value.type_id().to_le_bytes());
            put_value(&mut h, value);
        }
        h.update((file.tensors().len() as u64).to_le_bytes());
        for t in file.tensors() {
            put_str(&mut h, &t.name);
            h.update((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.update(d.to_le_bytes());
            }
            h.update(t.dtype.ggml_id().to_le_bytes());
            let data = file.tensor_data(t);
            h.update((data.len() as u64).to_le_bytes());
            h.update(data);
        }
        GgufDigest(h.finalize().into())
    }
}

/// The identity of a model whose file has `digest` and architecture
/// `arch`, running with caches of `cache`'s layout (module doc).
pub fn model_identity(digest: &GgufDigest, arch: &str, cache: &CacheConfig) -> ModelIdentity {
    let mut h = Sha256::new();
    h.update(IDENTITY_DOMAIN);
    h.update(digest.0);
    put_str(&mut h, arch);
    h.update(cache.dtype.ggml_id().to_le_bytes());
    h.update((cache.layers.len() as u64).to_le_bytes());
    for layer in &cache.layers {
        h.update((layer.width as u64).to_le_bytes());
        h.update(layer.window.unwrap_or(0).to_le_bytes());
    }
    ModelIdentity(h.finalize().into())
}

/// [`model_identity`] of `file` (hashing it) and its `general.architecture`.
pub fn identity_of(file: &GgufFile, cache: &CacheConfig) -> Result<ModelIdentity, GgufError> {
    let arch = file.architecture()?;
    Ok(model_identity(&GgufDigest::of(file), arch, cache))
}

fn put_str(h: &mut Sha256, s: &str) {
    h.update((s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

fn put_value(h: &mut Sha256, value: &Value) {
    match value {
        Value::U8(v) => h.update(v.to_le_bytes()),
        Value::I8(v) => h.update(v.to_le_bytes()),
        Value::U16(v) => h.update(v.to_le_bytes()),
        Value::I16(v) => h.update(v.to_le_bytes()),
        Value::U32(v) => h.update(v.to_le_bytes()),
        Value::I32(v) => h.update(v.to_le_bytes()),
        Value::F32(v) => h.update(v.to_bits().to_le_bytes()),
        Value::Bool(v) => h.update([u8::from(*v)]),
        Value::String(s) => put_str(h, s),
        Value::Array(a) => put_array(h, a),
        Value::U64(v) => h.update(v.to_le_bytes()),
        Value::I64(v) => h.update(v.to_le_bytes()),
        Value::F64(v) => h.update(v.to_bits().to_le_bytes()),
    }
}

fn put_array(h: &mut Sha256, a: &Array) {
    h.update(a.element_type_id().to_le_bytes());
    h.update((a.len() as u64).to_le_bytes());
    fn each<T>(h: &mut Sha256, items: &[T], put: impl Fn(&mut Sha256, &T)) {
        for item in items {
            put(h, item);
        }
    }
    match a {
        Array::U8(v) => h.update(v),
        Array::I8(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::U16(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::I16(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::U32(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::I32(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::F32(v) => each(h, v, |h, x| h.update(x.to_bits().to_le_bytes())),
        Array::Bool(v) => each(h, v, |h, x| h.update([u8::from(*x)])),
        Array::String(v) => each(h, v, |h, s| put_str(h, s)),
        Array::Array(v) => each(h, v, put_array),
        Array::U64(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::I64(v) => each(h, v, |h, x| h.update(x.to_le_bytes())),
        Array::F64(v) => each(h, v, |h, x| h.update(x.to_bits().to_le_bytes())),
    }
}
