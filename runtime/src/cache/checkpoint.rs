//! Checkpoints: a cache's sequence saved to a file and loaded back.
//!
//! The file is a [`CacheImage`] (every row a later step can read, by
//! position) behind a header that says what it is and for which model.
//! All integers are little-endian:
//!
//! ```text
//! offset  size  field
//! 0       8     magic  b"WEFT-KV\0"
//! 8       4     format version (1)
//! 12      32    model identity (caller-provided: a hash of the weights' identity and config)
//! 44      4     row type (GGUF type id: 0 = f32, 1 = f16)
//! 48      4     position (tokens in the cache)
//! 52      4     layer count L
//! 56      12*L  per layer: width, window (0: none), first saved position
//! ..      8     payload bytes P
//! ..      P     per layer: K rows, then V rows, in position order
//! ..      32    SHA-256 of every byte before it
//! ```
//!
//! Loading reads and checks the whole file before touching the cache:
//! truncation, magic, version, checksum, model identity and layout are each
//! refused with their own error, and a refused file leaves the cache as it
//! was. Saving writes a temporary file beside the target and renames it,
//! so a crash never leaves a half-written checkpoint under the real name.

use super::config::LayerSpec;
use super::image::{CacheImage, LayerRows};
use super::kv::KvCache;
use crate::{GraphExecutor, RuntimeError};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;
use weft_ops::DType;

/// First bytes of every checkpoint.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"WEFT-KV\0";
/// Format version this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 1;

const FIXED_HEADER: usize = 56;
const LAYER_HEADER: usize = 12;
const CHECKSUM: usize = 32;

/// Which model a cache belongs to: a hash the caller derives from the
/// weights' identity and the model config. A checkpoint only loads into a
/// cache of the same identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelIdentity(pub [u8; 32]);

impl ModelIdentity {
    /// SHA-256 over `parts`, each prefixed by its length (so `["ab", "c"]`
    /// and `["a", "bc"]` differ). Typical parts: the weights file's digest or
    /// name and size, and the serialized model config.
    pub fn from_parts(parts: &[&[u8]]) -> ModelIdentity {
        let mut h = Sha256::new();
        for part in parts {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        ModelIdentity(h.finalize().into())
    }

    /// The first 8 bytes in hex, for messages.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for ModelIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelIdentity({})", self.short())
    }
}

/// What a saved or loaded checkpoint held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Tokens in the cache.
    pub position: u32,
    /// Bytes of the file.
    pub file_bytes: u64,
}

fn refuse(why: String) -> RuntimeError {
    RuntimeError::Usage(format!("KV checkpoint: {why}"))
}

impl CacheImage {
    /// The image as checkpoint bytes for the model `identity`.
    pub fn to_checkpoint_bytes(&self, identity: &ModelIdentity) -> Vec<u8> {
        let payload: usize = self.layers.iter().map(|l| l.k.len() + l.v.len()).sum();
        let header = FIXED_HEADER + LAYER_HEADER * self.layers.len() + 8;
        let mut out = Vec::with_capacity(header + payload + CHECKSUM);
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        out.extend_from_slice(&identity.0);
        out.extend_from_slice(&self.dtype.ggml_id().to_le_bytes());
        out.extend_from_slice(&self.position.to_le_bytes());
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        for (spec, rows) in self.layout.iter().zip(&self.layers) {
            out.extend_from_slice(&(spec.width as u32).to_le_bytes());
            out.extend_from_slice(&spec.window.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&rows.first.to_le_bytes());
        }
        out.extend_from_slice(&(payload as u64).to_le_bytes());
        for rows in &self.layers {
            out.extend_from_slice(&rows.k);
            out.extend_from_slice(&rows.v);
        }
        let digest: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&digest);
        out
    }

    /// Parses checkpoint bytes written for the model `identity`. Checks, in
    /// order: length, magic, version, checksum, identity, then the layout.
    pub fn from_checkpoint_bytes(
        bytes: &[u8],
        identity: &ModelIdentity,
    ) -> Result<CacheImage, RuntimeError> {
        let mut r = Reader { bytes, at: 0 };
        let magic = r.take(8)?;
        if magic != CHECKPOINT_MAGIC {
            return Err(refuse(format!(
                "not a weft KV checkpoint (magic {magic:02x?}, expected {CHECKPOINT_MAGIC:02x?})"
            )));
        }
        let version = r.u32()?;
        if version != CHECKPOINT_VERSION {
            return Err(refuse(format!(
                "format version {version}; this build reads version {CHECKPOINT_VERSION} only: save the cache again with this build"
            )));
        }
        let header = Header::read(&mut r)?;
        let total = r.at as u64 + header.payload + CHECKSUM as u64;
        if (bytes.len() as u64) < total {
            return Err(refuse(format!(
                "the file is truncated: {} bytes, the header announces {total}",
                bytes.len()
            )));
        }
        if bytes.len() as u64 > total {
            return Err(refuse(format!(
                "{} unexpected bytes after the checksum (the header announces {total}); the file is corrupt",
                bytes.len() as u64 - total
            )));
        }
        let body = bytes.len() - CHECKSUM;
        let digest: [u8; 32] = Sha256::digest(&bytes[..body]).into();
        if digest[..] != bytes[body..] {
            return Err(refuse(
                "checksum mismatch: the contents were altered or damaged after saving".into(),
            ));
        }
        if header.identity != *identity {
            return Err(refuse(format!(
                "written for model {} but this cache belongs to model {}; load it with the model that saved it",
                header.identity.short(),
                identity.short()
            )));
        }
        header.into_image(&mut r)
    }
}

/// The header fields after the version.
struct Header {
    identity: ModelIdentity,
    dtype: DType,
    position: u32,
    layers: Vec<(LayerSpec, u32)>,
    payload: u64,
}

impl Header {
    fn read(r: &mut Reader<'_>) -> Result<Header, RuntimeError> {
        let mut identity = [0u8; 32];
        identity.copy_from_slice(r.take(32)?);
        let type_id = r.u32()?;
        let dtype = DType::from_ggml_id(type_id)
            .filter(|t| matches!(t, DType::F16 | DType::F32))
            .ok_or_else(|| refuse(format!("row type id {type_id} is not f32 (0) or f16 (1)")))?;
        let position = r.u32()?;
        let count = r.u32()? as usize;
        if count > r.remaining() / LAYER_HEADER {
            return Err(refuse(format!(
                "the file is truncated: {count} layers announced, {} bytes left",
                r.remaining()
            )));
        }
        let mut layers = Vec::with_capacity(count);
        for _ in 0..count {
            let width = r.u32()? as usize;
            let window = Some(r.u32()?).filter(|&w| w > 0);
            let first = r.u32()?;
            layers.push((LayerSpec { width, window }, first));
        }
        let payload = r.u64()?;
        Ok(Header {
            identity: ModelIdentity(identity),
            dtype,
            position,
            layers,
            payload,
        })
    }

    /// Splits the (checksummed) payload into layer rows.
    fn into_image(self, r: &mut Reader<'_>) -> Result<CacheImage, RuntimeError> {
        let mut layout = Vec::with_capacity(self.layers.len());
        let mut rows = Vec::with_capacity(self.layers.len());
        for (i, (spec, first)) in self.layers.into_iter().enumerate() {
            let row = self.dtype.row_bytes(spec.width).unwrap_or(0) as u64;
            let count = self.position.checked_sub(first).ok_or_else(|| {
                refuse(format!(
                    "layer {i} starts at position {first}, past the position {}",
                    self.position
                ))
            })?;
            let len = usize::try_from(count as u64 * row)
                .map_err(|_| refuse(format!("layer {i} is too large for this machine")))?;
            let k = r.take(len)?.to_vec();
            let v = r.take(len)?.to_vec();
            layout.push(spec);
            rows.push(LayerRows { first, k, v });
        }
        if r.remaining() != CHECKSUM {
            return Err(refuse(format!(
                "the payload does not match its layout ({} bytes left over); the file is corrupt",
                r.remaining().saturating_sub(CHECKSUM)
            )));
        }
        Ok(CacheImage {
            layout,
            dtype: self.dtype,
            position: self.position,
            layers: rows,
        })
    }
}

/// Reads little-endian fields, refusing to run past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RuntimeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(refuse(format!(
                "the file is truncated: {} bytes, needed {} more at offset {}",
                self.bytes.len(),
                n,
                self.at
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn u32(&mut self) -> Result<u32, RuntimeError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, RuntimeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
}

impl KvCache {
    /// Saves the cache's sequence to `path` for the model `identity`.
    /// Refused on a poisoned cache.
    pub fn save_checkpoint(
        &self,
        exec: &mut GraphExecutor,
        identity: &ModelIdentity,
        path: &Path,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let bytes = self.export(exec)?.to_checkpoint_bytes(identity);
        let io = |what: &str, e: std::io::Error| {
            refuse(format!("cannot {what} {}: {e}", path.display()))
        };
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp_name);
        let mut file = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        file.write_all(&bytes).map_err(|e| io("write", e))?;
        file.sync_all().map_err(|e| io("sync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("rename the temporary file to", e))?;
        Ok(CheckpointInfo {
            position: self.position,
            file_bytes: bytes.len() as u64,
        })
    }

    /// Loads the sequence saved at `path` (for the model `identity`) into
    /// this cache, replacing what it holds and clearing poison. A file that
    /// does not check out is refused and the cache is left as it was.
    pub fn load_checkpoint(
        &mut self,
        exec: &mut GraphExecutor,
        identity: &ModelIdentity,
        path: &Path,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let bytes = std::fs::read(path)
            .map_err(|e| refuse(format!("cannot read {}: {e}", path.display())))?;
        let image = CacheImage::from_checkpoint_bytes(&bytes, identity).map_err(|e| match e {
            RuntimeError::Usage(m) => RuntimeError::Usage(format!("{m} (file {})", path.display())),
            other => other,
        })?;
        self.import(exec, &image)?;
        Ok(CheckpointInfo {
            position: image.position,
            file_bytes: bytes.len() as u64,
        })
    }
}
