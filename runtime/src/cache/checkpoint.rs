//! Checkpoints: a cache's sequence saved to a file and loaded back.
//!
//! The file is a [`CacheImage`] (every row a later step can read, by
//! position) behind a header that says what it is and for which model.
//! All integers are little-endian:
//!
//! ```text
//! offset  size  field
//! 0       8     magic  b"WEFT-KV\0"
//! 8       4     format version (2; version 1 files, without the token list, still load)
//! 12      32    model identity (caller-provided; weft-models derives it from the GGUF and the cache layout)
//! 44      4     row type (GGUF type id: 0 = f32, 1 = f16)
//! 48      4     position (tokens in the cache)
//! 52      4     layer count L
//! 56      12*L  per layer: width, window (0: none), first position saved
//! ..      8     payload bytes P
//! ..      P     per layer: K rows, then V rows, in position order
//! ..      4     token count T (version 2 only): 0, or the position
//! ..      4*T   the token id at each position (version 2 only)
//! ..      32    SHA-256 of every byte before it
//! ```
//!
//! The token list is the caller's record of what the rows encode (a front
//! end matches a new prompt against it); a caller that keeps no such
//! record saves none (T = 0).
//!
//! A layer's first saved position is fixed by its window and the position
//! (every row a later query can see, nothing older), so each layer holds
//! exactly `position - first` rows of K and of V.
//!
//! Loading never trusts a field before checking it. It reads at most the
//! bytes a checkpoint of the target cache can take, then checks, in order:
//! magic, version, the layer table against the bytes present, the announced
//! length, the checksum, the model identity, every header field against the
//! target cache (row type, position, layer count, each layer's width and
//! window) and against each other (each layer's first position, the payload
//! size), and only then copies rows. Each refusal names the field, and a
//! refused file leaves the cache as it was. A checksum proves only that the
//! bytes are the ones written, not that the writer was honest, hence the
//! field checks. Saving is atomic (`checkpoint_file.rs`): a crash or a
//! concurrent save never leaves a half-written checkpoint under the name.

use super::checkpoint_file::{read_bounded, write_atomically, Bounded};
use super::config::{CacheConfig, LayerSpec};
use super::image::{CacheImage, LayerRows};
use super::kv::KvCache;
use crate::{GraphExecutor, RuntimeError};
use sha2::{Digest, Sha256};
use std::path::Path;
use weft_ops::DType;

/// First bytes of every checkpoint.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"WEFT-KV\0";
/// Format version this build writes (it reads this one and version 1).
pub const CHECKPOINT_VERSION: u32 = 2;
/// The oldest format version this build reads: no token list.
const FIRST_VERSION: u32 = 1;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Tokens in the cache.
    pub position: u32,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// The token id at each position, as the saver recorded them (empty
    /// when it recorded none).
    pub tokens: Vec<u32>,
}

fn refuse(why: String) -> RuntimeError {
    RuntimeError::Usage(format!("KV checkpoint: {why}"))
}

impl CacheImage {
    /// The image as checkpoint bytes for the model `identity`, with
    /// `tokens` (empty, or one per position: checked by the caller, see
    /// [`KvCache::save_checkpoint`]).
    pub fn to_checkpoint_bytes(&self, identity: &ModelIdentity, tokens: &[u32]) -> Vec<u8> {
        let payload: usize = self.layers.iter().map(|l| l.k.len() + l.v.len()).sum();
        let header = FIXED_HEADER + LAYER_HEADER * self.layers.len() + 8;
        let token_bytes = 4 + 4 * tokens.len();
        let mut out = Vec::with_capacity(header + payload + token_bytes + CHECKSUM);
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
        out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        let digest: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&digest);
        out
    }

    /// Parses checkpoint bytes written for the model `identity`: the image
    /// and its token list. Checks, in order: magic, version, length,
    /// checksum, identity, then the fields against each other; rows are
    /// copied only after all of them pass.
    pub fn from_checkpoint_bytes(
        bytes: &[u8],
        identity: &ModelIdentity,
    ) -> Result<(CacheImage, Vec<u32>), RuntimeError> {
        let header = Header::verified(bytes, identity)?;
        let sizes = header.check_rows()?;
        header.into_image(bytes, &sizes, u32::MAX)
    }
}

/// Most bytes a checkpoint of a cache of `config` can take: the header,
/// every row each layer can hold (the whole context, or `window - 1`
/// positions of a windowed layer), a token per position, the checksum.
pub fn checkpoint_bound(config: &CacheConfig) -> u64 {
    let layers = config.layers.len() as u64;
    let tokens = 4 * config.context as u64 + 4;
    let rows = config.layers.iter().fold(tokens, |sum, l| {
        let kept = match l.window {
            Some(w) => (w.saturating_sub(1)).min(config.context),
            None => config.context,
        };
        let bytes = (kept as u64).saturating_mul(2 * config.row_bytes(l));
        sum.saturating_add(bytes)
    });
    (FIXED_HEADER as u64 + 8 + CHECKSUM as u64)
        .saturating_add(layers.saturating_mul(LAYER_HEADER as u64))
        .saturating_add(rows)
}

/// The first position a layer with `window` keeps at `position` (what
/// [`super::LayerCache::needed_from`] computes for a live cache).
fn first_kept(window: Option<u32>, position: u32) -> u32 {
    window.map_or(0, |w| {
        position.saturating_add(1).saturating_sub(w).min(position)
    })
}

/// One entry of the layer table, as written.
struct FileLayer {
    width: u32,
    /// 0: no window.
    window: u32,
    first: u32,
}

impl FileLayer {
    fn window(&self) -> Option<u32> {
        Some(self.window).filter(|&w| w > 0)
    }
}

/// The header fields after the version, read but not yet trusted.
struct Header {
    identity: ModelIdentity,
    dtype: DType,
    position: u32,
    layers: Vec<FileLayer>,
    payload: u64,
    /// Offset of the first row byte.
    rows_at: usize,
    /// Tokens listed after the rows (0 in a version 1 file).
    tokens: u32,
}

impl Header {
    /// Reads the header and checks what needs no cache: magic, version,
    /// row type, the layer table against the bytes present, the announced
    /// length, the checksum and the model identity.
    fn verified(bytes: &[u8], identity: &ModelIdentity) -> Result<Header, RuntimeError> {
        let mut r = Reader { bytes, at: 0 };
        let magic = r.take(8)?;
        if magic != CHECKPOINT_MAGIC {
            return Err(refuse(format!(
                "not a weft KV checkpoint (magic {magic:02x?}, expected {CHECKPOINT_MAGIC:02x?})"
            )));
        }
        let version = r.u32()?;
        if !(FIRST_VERSION..=CHECKPOINT_VERSION).contains(&version) {
            return Err(refuse(format!(
                "format version {version}; this build reads versions {FIRST_VERSION} to {CHECKPOINT_VERSION}: save the cache again with this build"
            )));
        }
        let mut header = Header::read(&mut r)?;
        let rows_end = (header.rows_at as u64).saturating_add(header.payload);
        let mut total = rows_end.saturating_add(CHECKSUM as u64);
        if version >= 2 {
            // The token count sits after the rows; bounded by the bytes present.
            let at = usize::try_from(rows_end).ok().filter(|&at| {
                at.checked_add(4 + CHECKSUM)
                    .is_some_and(|end| end <= bytes.len())
            });
            let Some(at) = at else {
                return Err(refuse(format!(
                    "the file is truncated: {} bytes, the header (field `payload bytes` = {}) announces at least {}",
                    bytes.len(),
                    header.payload,
                    total.saturating_add(4)
                )));
            };
            let mut count = [0u8; 4];
            count.copy_from_slice(&bytes[at..at + 4]);
            header.tokens = u32::from_le_bytes(count);
            total = total.saturating_add(4 + 4 * header.tokens as u64);
        }
        if (bytes.len() as u64) < total {
            return Err(refuse(format!(
                "the file is truncated: {} bytes, the header (field `payload bytes` = {}, \
                 field `token count` = {}) announces {total}",
                bytes.len(),
                header.payload,
                header.tokens
            )));
        }
        if bytes.len() as u64 > total {
            return Err(refuse(format!(
                "{} unexpected bytes after the checksum (the header, field `payload bytes` = {}, \
                 field `token count` = {}, announces {total}); the file is corrupt",
                bytes.len() as u64 - total,
                header.payload,
                header.tokens
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
        Ok(header)
    }

    fn read(r: &mut Reader<'_>) -> Result<Header, RuntimeError> {
        let mut identity = [0u8; 32];
        identity.copy_from_slice(r.take(32)?);
        let type_id = r.u32()?;
        let dtype = DType::from_ggml_id(type_id)
            .filter(|t| matches!(t, DType::F16 | DType::F32))
            .ok_or_else(|| {
                refuse(format!(
                    "field `row type` is {type_id}; a checkpoint holds f32 (0) or f16 (1) rows"
                ))
            })?;
        let position = r.u32()?;
        let count = r.u32()? as usize;
        // Bounded by the bytes present before anything is allocated for it.
        if count > r.remaining() / LAYER_HEADER {
            return Err(refuse(format!(
                "the file is truncated: field `layer count` announces {count} layers, {} bytes are left",
                r.remaining()
            )));
        }
        let mut layers = Vec::with_capacity(count);
        for _ in 0..count {
            layers.push(FileLayer {
                width: r.u32()?,
                window: r.u32()?,
                first: r.u32()?,
            });
        }
        let payload = r.u64()?;
        Ok(Header {
            identity: ModelIdentity(identity),
            dtype,
            position,
            layers,
            payload,
            rows_at: r.at,
            tokens: 0,
        })
    }

    /// Checks the fields against the cache they are loaded into: row type,
    /// position, layer count, each layer's width and window.
    fn check_fits(&self, config: &CacheConfig) -> Result<(), RuntimeError> {
        let misfit = |why: String| {
            Err(refuse(format!(
                "the saved sequence does not fit this cache: {why}; \
                 load it into a cache built with the same model and layout"
            )))
        };
        if self.dtype != config.dtype {
            return misfit(format!(
                "field `row type` is {}, this cache holds {} rows",
                self.dtype, config.dtype
            ));
        }
        if self.position > config.context {
            return misfit(format!(
                "field `position` is {}, past the context length of {}",
                self.position, config.context
            ));
        }
        if self.layers.len() != config.layers.len() {
            return misfit(format!(
                "field `layer count` is {}, this cache has {} layers",
                self.layers.len(),
                config.layers.len()
            ));
        }
        for (i, (file, spec)) in self.layers.iter().zip(&config.layers).enumerate() {
            if file.width as usize != spec.width {
                return misfit(format!(
                    "layer {i}: field `width` is {}, this cache's layer holds {} values per row",
                    file.width, spec.width
                ));
            }
            if file.window() != spec.window {
                return misfit(format!(
                    "layer {i}: field `window` is {} (0: none), this cache's layer has {}",
                    file.window,
                    spec.window.unwrap_or(0)
                ));
            }
        }
        Ok(())
    }

    /// Checks the fields against each other: each layer's first position
    /// against its window and the position, the payload size against the
    /// layer table, the token count against the position (and, once read,
    /// each token against the vocabulary, see [`Header::into_image`]).
    /// Returns each layer's bytes of K (and of V).
    fn check_rows(&self) -> Result<Vec<usize>, RuntimeError> {
        if self.tokens != 0 && self.tokens != self.position {
            return Err(refuse(format!(
                "field `token count` is {}; a checkpoint lists 0 tokens or one per position \
                 (field `position` = {}); the file is corrupt",
                self.tokens, self.position
            )));
        }
        let mut sizes = Vec::with_capacity(self.layers.len());
        let mut total = 0u64;
        for (i, layer) in self.layers.iter().enumerate() {
            if layer.width == 0 {
                return Err(refuse(format!("layer {i}: field `width` is 0")));
            }
            if layer.first > self.position {
                return Err(refuse(format!(
                    "layer {i}: field `first position` is {}, past field `position` {}",
                    layer.first, self.position
                )));
            }
            let expected = first_kept(layer.window(), self.position);
            if layer.first != expected {
                return Err(refuse(format!(
                    "layer {i}: field `first position` is {}, but a layer with window {} (0: none) \
                     at position {} keeps rows from {expected}",
                    layer.first, layer.window, self.position
                )));
            }
            let row = self.dtype.row_bytes(layer.width as usize).unwrap_or(0) as u64;
            let bytes = row.checked_mul((self.position - layer.first) as u64);
            let both = bytes.and_then(|b| b.checked_mul(2));
            let (Some(bytes), Some(sum)) = (bytes, both.and_then(|b| total.checked_add(b))) else {
                return Err(refuse(format!(
                    "layer {i}: field `width` {} at position {} overflows the payload",
                    layer.width, self.position
                )));
            };
            // At most the payload, which the file length bounds.
            total = sum;
            sizes.push(
                usize::try_from(bytes)
                    .map_err(|_| refuse(format!("layer {i} is too large for this machine")))?,
            );
        }
        if total != self.payload {
            return Err(refuse(format!(
                "field `payload bytes` is {}, the layer table needs {total}; the file is corrupt",
                self.payload
            )));
        }
        Ok(sizes)
    }

    /// Copies the (checked) rows, `sizes[i]` bytes of K and of V per
    /// layer, and the token list, refusing a token id at or above
    /// `token_bound`.
    fn into_image(
        self,
        bytes: &[u8],
        sizes: &[usize],
        token_bound: u32,
    ) -> Result<(CacheImage, Vec<u32>), RuntimeError> {
        let mut r = Reader {
            bytes,
            at: self.rows_at,
        };
        let mut layout = Vec::with_capacity(self.layers.len());
        let mut rows = Vec::with_capacity(self.layers.len());
        for (layer, &len) in self.layers.iter().zip(sizes) {
            let k = r.take(len)?.to_vec();
            let v = r.take(len)?.to_vec();
            layout.push(LayerSpec {
                width: layer.width as usize,
                window: layer.window(),
            });
            rows.push(LayerRows {
                first: layer.first,
                k,
                v,
            });
        }
        let mut tokens = Vec::new();
        if r.remaining() > CHECKSUM {
            let count = r.u32()?;
            tokens.reserve(count as usize);
            for i in 0..count {
                let t = r.u32()?;
                if t >= token_bound {
                    return Err(refuse(format!(
                        "token {i} is id {t}, outside the vocabulary of {token_bound}; the file is corrupt"
                    )));
                }
                tokens.push(t);
            }
        }
        if r.remaining() != CHECKSUM {
            return Err(refuse(format!(
                "the payload does not match its layout ({} bytes left over); the file is corrupt",
                r.remaining().saturating_sub(CHECKSUM)
            )));
        }
        let image = CacheImage {
            layout,
            dtype: self.dtype,
            position: self.position,
            layers: rows,
        };
        Ok((image, tokens))
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
    /// Saves the cache's sequence to `path` for the model `identity`,
    /// atomically, with `tokens`: empty, or the token at each position.
    /// Refused on a poisoned cache or a token list of another length.
    pub fn save_checkpoint(
        &self,
        exec: &mut GraphExecutor,
        identity: &ModelIdentity,
        tokens: &[u32],
        path: &Path,
    ) -> Result<CheckpointInfo, RuntimeError> {
        if !tokens.is_empty() && tokens.len() != self.position as usize {
            return Err(refuse(format!(
                "{} tokens given for a cache at position {}; give none or one per position",
                tokens.len(),
                self.position
            )));
        }
        let bytes = self.export(exec)?.to_checkpoint_bytes(identity, tokens);
        write_atomically(path, &bytes).map_err(|e| refuse(e.to_string()))?;
        Ok(CheckpointInfo {
            position: self.position,
            file_bytes: bytes.len() as u64,
            tokens: tokens.to_vec(),
        })
    }

    /// Loads the sequence saved at `path` (for the model `identity`) into
    /// this cache, replacing what it holds and clearing poison; a listed
    /// token id at or above `token_bound` (the vocabulary size) is refused.
    /// A file that does not check out is refused and the cache is left as
    /// it was.
    pub fn load_checkpoint(
        &mut self,
        exec: &mut GraphExecutor,
        identity: &ModelIdentity,
        token_bound: u32,
        path: &Path,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let in_file = |e: RuntimeError| match e {
            RuntimeError::Usage(m) => RuntimeError::Usage(format!("{m} (file {})", path.display())),
            other => other,
        };
        let limit = checkpoint_bound(&self.config);
        let bytes = match read_bounded(path, limit).map_err(|e| refuse(e.to_string()))? {
            Bounded::Bytes(bytes) => bytes,
            Bounded::TooLarge(len) => {
                return Err(in_file(refuse(format!(
                    "the file holds {len} bytes, more than the {limit} a checkpoint of this cache \
                     ({} layers, context {}) can take; it was saved from another cache or is corrupt",
                    self.config.layers.len(),
                    self.config.context
                ))))
            }
        };
        let (image, tokens) = Header::verified(&bytes, identity)
            .and_then(|header| {
                header.check_fits(&self.config)?;
                let sizes = header.check_rows()?;
                header.into_image(&bytes, &sizes, token_bound)
            })
            .map_err(in_file)?;
        self.import(exec, &image)?;
        Ok(CheckpointInfo {
            position: image.position,
            file_bytes: bytes.len() as u64,
            tokens,
        })
    }
}
