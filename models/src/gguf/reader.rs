//! Parsing and validating the GGUF layout: header, metadata, tensor infos.
//!
//! Nothing here trusts the file. Every count is checked against the bytes
//! that remain before anything is reserved (each metadata entry needs at
//! least [`MIN_KV_BYTES`], each tensor info at least [`MIN_TENSOR_INFO_BYTES`],
//! each array element at least its type's smallest encoding), so memory use
//! stays a small multiple of the file size whatever the counts claim.
//! Array nesting is capped at [`MAX_ARRAY_DEPTH`]. Every error names the field
//! and the byte offset where it lies.

use weft_ops::DType;

use super::error::GgufError;
use super::value::{self, type_id, Array, Value};
use super::TensorInfo;

/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays of arrays the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest metadata entry: key length (8), value type (4), a one-byte value.
pub const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest tensor info: name length (8), dimension count (4), one dimension
/// (8), type (4), offset (8).
pub const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;
/// Key holding the tensor data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Everything the header, metadata and tensor infos say, validated.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, Value)>,
    /// Byte offset of each metadata entry (its key), parallel to `metadata`.
    pub key_offsets: Vec<u64>,
    /// Indices into `metadata`, sorted by key.
    pub key_index: Vec<usize>,
    pub tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    pub tensor_index: Vec<usize>,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.bytes.len().saturating_sub(self.pos) as u64
    }

    /// The next `n` bytes; `what` names the field for the error.
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .and_then(|end| self.bytes.get(self.pos..end).map(|s| (s, end)));
        match slice {
            Some((s, end)) => {
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                need: n,
                len: self.bytes.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, GgufError> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 length, then that many UTF-8 bytes.
    fn string(&mut self, what: impl Fn() -> String) -> Result<&'a str, GgufError> {
        let len = self.u64(|| format!("length of {}", what()))?;
        let at = self.offset();
        let bytes = self.take(len, &what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset: at,
        })
    }

    /// Refuses a count of items that cannot fit in the remaining bytes when
    /// each item takes at least `min_each` bytes.
    fn check_count(
        &self,
        count: u64,
        min_each: u64,
        count_at: u64,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufError> {
        let fits = count
            .checked_mul(min_each)
            .is_some_and(|need| need <= self.remaining());
        match usize::try_from(count) {
            Ok(n) if fits => Ok(n),
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                count,
                offset: count_at,
                min_each,
                remaining: self.remaining(),
            }),
        }
    }
}

/// Parses and validates a whole GGUF file held in `bytes`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { bytes, pos: 0 };
    let version = read_header(&mut cur)?;
    let tensors_at = cur.offset();
    let n_tensors = cur.u64(|| "tensor count".into())?;
    let kvs_at = cur.offset();
    let n_kv = cur.u64(|| "metadata entry count".into())?;
    let n_kv = cur.check_count(n_kv, MIN_KV_BYTES, kvs_at, || "metadata entry count".into())?;
    let n_tensors = cur.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, tensors_at, || {
        "tensor count".into()
    })?;

    let (metadata, key_offsets) = read_metadata(&mut cur, n_kv)?;
    let key_index = sorted_index(&metadata, |(k, _)| k.as_str());
    check_duplicate_keys(&metadata, &key_offsets, &key_index)?;
    let alignment = alignment_of(&metadata, &key_offsets, &key_index)?;

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut info_offsets = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        info_offsets.push(cur.offset());
        tensors.push(read_tensor_info(&mut cur, alignment)?);
    }
    let tensor_index = sorted_index(&tensors, |t| t.name.as_str());
    check_duplicate_tensors(&tensors, &info_offsets, &tensor_index)?;

    let data_offset = align_up(cur.offset(), alignment).ok_or_else(|| GgufError::Truncated {
        what: "padding before tensor data".into(),
        offset: cur.offset(),
        need: alignment,
        len: bytes.len() as u64,
    })?;
    place_tensors(&mut tensors, data_offset, bytes.len() as u64)?;
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        key_offsets,
        key_index,
        tensors,
        tensor_index,
    })
}

/// Magic and version; returns the version.
fn read_header(cur: &mut Cursor<'_>) -> Result<u32, GgufError> {
    let magic = cur.array::<4>(|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            found: magic.escape_ascii().to_string(),
        });
    }
    let version = cur.u32(|| "version".into())?;
    let hint = match version {
        2 | 3 => return Ok(version),
        1 => "GGUF v1 (32-bit counts) is obsolete; convert the file to v3 with a current llama.cpp",
        v if matches!(v.swap_bytes(), 2 | 3) => {
            "the file is big-endian; weft reads little-endian GGUF only"
        }
        _ => "weft reads GGUF versions 2 and 3",
    };
    Err(GgufError::UnsupportedVersion { version, hint })
}

/// Metadata entries in file order and the byte offset of each.
type Entries = (Vec<(String, Value)>, Vec<u64>);

fn read_metadata(cur: &mut Cursor<'_>, n_kv: usize) -> Result<Entries, GgufError> {
    let mut metadata = Vec::with_capacity(n_kv);
    let mut offsets = Vec::with_capacity(n_kv);
    for index in 0..n_kv {
        let at = cur.offset();
        let key = cur.string(|| format!("key of metadata entry {index}"))?;
        let type_at = cur.offset();
        let type_id = cur.u32(|| format!("value type of metadata key `{key}`"))?;
        let value = read_value(cur, type_id, type_at, key, 0)?;
        metadata.push((key.to_owned(), value));
        offsets.push(at);
    }
    Ok((metadata, offsets))
}

/// One value of type `type_id` (read at `type_at`) for metadata key `key`.
fn read_value(
    cur: &mut Cursor<'_>,
    type_id: u32,
    type_at: u64,
    key: &str,
    depth: usize,
) -> Result<Value, GgufError> {
    let what = || format!("value of metadata key `{key}`");
    Ok(match type_id {
        type_id::U8 => Value::U8(cur.u8(what)?),
        type_id::I8 => Value::I8(i8::from_le_bytes(cur.array(what)?)),
        type_id::U16 => Value::U16(u16::from_le_bytes(cur.array(what)?)),
        type_id::I16 => Value::I16(i16::from_le_bytes(cur.array(what)?)),
        type_id::U32 => Value::U32(cur.u32(what)?),
        type_id::I32 => Value::I32(i32::from_le_bytes(cur.array(what)?)),
        type_id::F32 => Value::F32(f32::from_le_bytes(cur.array(what)?)),
        type_id::U64 => Value::U64(cur.u64(what)?),
        type_id::I64 => Value::I64(i64::from_le_bytes(cur.array(what)?)),
        type_id::F64 => Value::F64(f64::from_le_bytes(cur.array(what)?)),
        type_id::BOOL => {
            let at = cur.offset();
            Value::Bool(to_bool(cur.u8(what)?, key, at)?)
        }
        type_id::STRING => Value::String(cur.string(what)?.to_owned()),
        type_id::ARRAY => Value::Array(read_array(cur, key, depth)?),
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.into(),
                type_id: other,
                offset: type_at,
            })
        }
    })
}

fn to_bool(byte: u8, key: &str, at: u64) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(GgufError::BadBool {
            key: key.into(),
            value,
            offset: at,
        }),
    }
}

/// An array: element type (u32), length (u64), elements. `depth` is how many
/// arrays enclose this one.
fn read_array(cur: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, GgufError> {
    let type_at = cur.offset();
    let elem = cur.u32(|| format!("element type of array `{key}`"))?;
    let len_at = cur.offset();
    let len = cur.u64(|| format!("length of array `{key}`"))?;
    let Some(min_each) = value::min_size(elem) else {
        return Err(GgufError::UnknownValueType {
            key: key.into(),
            type_id: elem,
            offset: type_at,
        });
    };
    if elem == type_id::ARRAY && depth + 1 >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.into(),
            limit: MAX_ARRAY_DEPTH,
            offset: type_at,
        });
    }
    let n = cur.check_count(len, min_each, len_at, || format!("length of array `{key}`"))?;
    let what = || format!("elements of array `{key}`");
    Ok(match elem {
        type_id::U8 => Array::U8(fixed(cur, n, what, u8::from_le_bytes)?),
        type_id::I8 => Array::I8(fixed(cur, n, what, i8::from_le_bytes)?),
        type_id::U16 => Array::U16(fixed(cur, n, what, u16::from_le_bytes)?),
        type_id::I16 => Array::I16(fixed(cur, n, what, i16::from_le_bytes)?),
        type_id::U32 => Array::U32(fixed(cur, n, what, u32::from_le_bytes)?),
        type_id::I32 => Array::I32(fixed(cur, n, what, i32::from_le_bytes)?),
        type_id::F32 => Array::F32(fixed(cur, n, what, f32::from_le_bytes)?),
        type_id::U64 => Array::U64(fixed(cur, n, what, u64::from_le_bytes)?),
        type_id::I64 => Array::I64(fixed(cur, n, what, i64::from_le_bytes)?),
        type_id::F64 => Array::F64(fixed(cur, n, what, f64::from_le_bytes)?),
        type_id::BOOL => {
            let at = cur.offset();
            let raw = cur.take(len, what)?;
            let mut out = Vec::with_capacity(n);
            for (i, &b) in raw.iter().enumerate() {
                out.push(to_bool(b, key, at + i as u64)?);
            }
            Array::Bool(out)
        }
        type_id::STRING => {
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                out.push(
                    cur.string(|| format!("element {i} of array `{key}`"))?
                        .to_owned(),
                );
            }
            Array::String(out)
        }
        _ => {
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                out.push(read_array(cur, key, depth + 1)?);
            }
            Array::Array(out)
        }
    })
}

/// `n` fixed-size little-endian elements of `N` bytes each.
fn fixed<const N: usize, T>(
    cur: &mut Cursor<'_>,
    n: usize,
    what: impl FnOnce() -> String,
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let raw = cur.take((n as u64).saturating_mul(N as u64), what)?;
    Ok(raw
        .chunks_exact(N)
        .map(|chunk| {
            let mut bytes = [0u8; N];
            bytes.copy_from_slice(chunk);
            decode(bytes)
        })
        .collect())
}

/// Indices of `items` sorted by `name` (stable: equal names keep file order).
fn sorted_index<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<usize> {
    let mut index: Vec<usize> = (0..items.len()).collect();
    index.sort_by(|&a, &b| match (items.get(a), items.get(b)) {
        (Some(x), Some(y)) => name(x).cmp(name(y)),
        _ => a.cmp(&b),
    });
    index
}

/// The first pair of equal names in a sorted index, as (earlier, later).
fn first_duplicate<T>(
    items: &[T],
    index: &[usize],
    name: impl Fn(&T) -> &str,
) -> Option<(usize, usize)> {
    index.windows(2).find_map(|pair| match *pair {
        [a, b] => match (items.get(a), items.get(b)) {
            (Some(x), Some(y)) if name(x) == name(y) => Some((a, b)),
            _ => None,
        },
        _ => None,
    })
}

fn check_duplicate_keys(
    metadata: &[(String, Value)],
    offsets: &[u64],
    index: &[usize],
) -> Result<(), GgufError> {
    let Some((first, later)) = first_duplicate(metadata, index, |(k, _)| k.as_str()) else {
        return Ok(());
    };
    Err(GgufError::DuplicateKey {
        key: metadata
            .get(later)
            .map(|(k, _)| k.clone())
            .unwrap_or_default(),
        offset: offsets.get(later).copied().unwrap_or_default(),
        first: offsets.get(first).copied().unwrap_or_default(),
    })
}

fn check_duplicate_tensors(
    tensors: &[TensorInfo],
    offsets: &[u64],
    index: &[usize],
) -> Result<(), GgufError> {
    let Some((first, later)) = first_duplicate(tensors, index, |t| t.name.as_str()) else {
        return Ok(());
    };
    Err(GgufError::DuplicateTensor {
        name: tensors
            .get(later)
            .map(|t| t.name.clone())
            .unwrap_or_default(),
        offset: offsets.get(later).copied().unwrap_or_default(),
        first: offsets.get(first).copied().unwrap_or_default(),
    })
}

/// `general.alignment` (any integer type) or the default; a nonzero power of two.
fn alignment_of(
    metadata: &[(String, Value)],
    offsets: &[u64],
    index: &[usize],
) -> Result<u64, GgufError> {
    let found = index
        .binary_search_by(|&i| {
            metadata
                .get(i)
                .map_or("", |(k, _)| k.as_str())
                .cmp(ALIGNMENT_KEY)
        })
        .ok()
        .and_then(|pos| index.get(pos).copied());
    let Some(i) = found else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let (value, offset) = match (metadata.get(i), offsets.get(i)) {
        (Some((_, v)), Some(&o)) => (v, o),
        _ => return Ok(DEFAULT_ALIGNMENT),
    };
    match value.as_integer().and_then(|v| u64::try_from(v).ok()) {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError::BadAlignment {
            value: format!("{value} ({})", value.type_description()),
            offset,
        }),
    }
}

/// One tensor info; `offset` is left relative to the data section and
/// `bytes` is computed and overflow-checked.
fn read_tensor_info(cur: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo, GgufError> {
    let at = cur.offset();
    let name = cur
        .string(|| format!("name of the tensor info at byte 0x{at:x}"))?
        .to_owned();
    let n_dims_at = cur.offset();
    let n_dims = cur.u32(|| format!("dimension count of tensor `{name}`"))?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(GgufError::BadDimCount {
            name,
            n_dims,
            offset: n_dims_at,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for index in 0..n_dims as usize {
        let dim_at = cur.offset();
        let value = cur.u64(|| format!("dimension {index} of tensor `{name}`"))?;
        if i64::try_from(value).is_err() {
            return Err(GgufError::DimTooLarge {
                name,
                index,
                value,
                offset: dim_at,
            });
        }
        dims.push(value);
    }
    let type_at = cur.offset();
    let type_id = cur.u32(|| format!("type of tensor `{name}`"))?;
    let Some(dtype) = DType::from_ggml_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            name,
            type_id,
            offset: type_at,
        });
    };
    let offset_at = cur.offset();
    let offset = cur.u64(|| format!("data offset of tensor `{name}`"))?;
    let bytes = tensor_bytes(&name, &dims, dtype, at)?;
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            name,
            data_offset: offset,
            alignment,
            offset: offset_at,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        dtype,
        offset,
        bytes,
    })
}

/// Byte size of a tensor of `dims` (ne0 first) and `dtype`, with every
/// product overflow-checked against `i64` like ggml does.
pub(crate) fn tensor_bytes(
    name: &str,
    dims: &[u64],
    dtype: DType,
    at: u64,
) -> Result<u64, GgufError> {
    let overflow = |what| GgufError::ShapeOverflow {
        name: name.into(),
        dims: dims.to_vec(),
        dtype,
        what,
        offset: at,
    };
    let max = i64::MAX as u64;
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d).filter(|&n| n <= max));
    if elements.is_none() {
        return Err(overflow("element count"));
    }
    let ne0 = dims.first().copied().unwrap_or(1);
    let block_len = dtype.block_len() as u64;
    if !ne0.is_multiple_of(block_len) {
        return Err(GgufError::PartialBlock {
            name: name.into(),
            ne0,
            dtype,
            block_len,
            offset: at,
        });
    }
    let row_bytes = (ne0 / block_len).checked_mul(dtype.block_bytes() as u64);
    let rows = dims
        .iter()
        .skip(1)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d));
    row_bytes
        .zip(rows)
        .and_then(|(r, n)| r.checked_mul(n))
        .filter(|&b| b <= max)
        .ok_or_else(|| overflow("byte size"))
}

/// Turns relative offsets into absolute ones and checks every tensor's data
/// lies inside the file, apart from every other tensor's.
fn place_tensors(tensors: &mut [TensorInfo], data_offset: u64, len: u64) -> Result<(), GgufError> {
    for t in tensors.iter_mut() {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= len => t.offset = start,
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    len,
                })
            }
        }
    }
    check_overlaps(tensors)
}

/// Refuses two tensors whose data share a byte: a file whose tensors alias
/// each other is corrupt (a writer lays every tensor out on its own), and
/// its weights would silently be read twice. Empty tensors occupy nothing.
fn check_overlaps(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|t| t.bytes > 0).collect();
    by_start.sort_by_key(|t| (t.offset, t.bytes));
    for pair in by_start.windows(2) {
        if let [a, b] = *pair {
            let a_end = a.offset.saturating_add(a.bytes);
            if b.offset < a_end {
                return Err(GgufError::TensorOverlap {
                    name: b.name.clone(),
                    start: b.offset,
                    end: b.offset.saturating_add(b.bytes),
                    other: a.name.clone(),
                    other_start: a.offset,
                    other_end: a_end,
                });
            }
        }
    }
    Ok(())
}

/// `value` rounded up to a multiple of `alignment` (a power of two).
pub(crate) fn align_up(value: u64, alignment: u64) -> Option<u64> {
    let mask = alignment.checked_sub(1)?;
    value.checked_add(mask).map(|v| v & !mask)
}
