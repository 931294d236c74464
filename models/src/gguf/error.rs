//! The one error type of the GGUF reader and writer.
//!
//! Every message starts with `[gguf]` (or `[gguf::writer]`), names the field
//! at fault (metadata key, tensor name, header field) and, for anything read
//! from a file, the byte offset where it lies, so a user can find the bad
//! bytes with a hex dump.

use std::path::PathBuf;

use weft_ops::DType;

/// Why a GGUF file could not be read, a metadata value had the wrong type,
/// or the writer refused its input.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("[gguf] cannot read `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A field runs past the end of the file.
    #[error("[gguf] {what} at byte 0x{offset:x} needs {need} bytes, but the file ends at byte 0x{len:x}")]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        len: u64,
    },

    /// The first four bytes are not `GGUF`.
    #[error("[gguf] magic at byte 0x0 is {found:?}, expected \"GGUF\": not a GGUF file")]
    BadMagic { found: String },

    /// The version is not 2 or 3.
    #[error("[gguf] version {version} at byte 0x4 is not supported: {hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },

    /// A count (tensors, metadata entries, array elements) cannot fit in the
    /// bytes that remain, so the file is lying about it.
    #[error(
        "[gguf] {what} at byte 0x{offset:x} is {count}, but each needs at least {min_each} bytes \
         and only {remaining} bytes remain"
    )]
    CountTooLarge {
        what: String,
        count: u64,
        offset: u64,
        min_each: u64,
        remaining: u64,
    },

    /// A string (key, value, tensor name) is not UTF-8.
    #[error("[gguf] {what} at byte 0x{offset:x} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    /// A metadata value type id outside 0..=12.
    #[error("[gguf] metadata key `{key}`: unknown value type {type_id} at byte 0x{offset:x}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },

    /// Arrays of arrays nested past the limit.
    #[error("[gguf] metadata key `{key}`: arrays nested deeper than {limit} levels at byte 0x{offset:x}")]
    NestingTooDeep {
        key: String,
        limit: usize,
        offset: u64,
    },

    /// A bool byte other than 0 or 1.
    #[error(
        "[gguf] metadata key `{key}`: bool at byte 0x{offset:x} holds {value}, expected 0 or 1"
    )]
    BadBool { key: String, value: u8, offset: u64 },

    /// The same metadata key twice.
    #[error("[gguf] metadata key `{key}` at byte 0x{offset:x} repeats the key first seen at byte 0x{first:x}")]
    DuplicateKey {
        key: String,
        offset: u64,
        first: u64,
    },

    /// `general.alignment` is zero, not a power of two, or not an integer.
    #[error("[gguf] metadata key `general.alignment` at byte 0x{offset:x} is {value}; it must be a nonzero power of two")]
    BadAlignment { value: String, offset: u64 },

    /// The same tensor name twice.
    #[error("[gguf] tensor `{name}` at byte 0x{offset:x} repeats the tensor first seen at byte 0x{first:x}")]
    DuplicateTensor {
        name: String,
        offset: u64,
        first: u64,
    },

    /// A dimension count outside 1..=4.
    #[error(
        "[gguf] tensor `{name}` at byte 0x{offset:x} has {n_dims} dimensions; GGUF allows 1 to 4"
    )]
    BadDimCount {
        name: String,
        n_dims: u32,
        offset: u64,
    },

    /// A dimension above `i64::MAX` (ggml stores dimensions as `int64_t`).
    #[error("[gguf] tensor `{name}`: dimension {index} at byte 0x{offset:x} is {value}, larger than i64::MAX")]
    DimTooLarge {
        name: String,
        index: usize,
        value: u64,
        offset: u64,
    },

    /// The element count or byte size of a tensor overflows.
    #[error("[gguf] tensor `{name}` at byte 0x{offset:x}: shape {dims:?} of type {dtype} overflows its {what}")]
    ShapeOverflow {
        name: String,
        dims: Vec<u64>,
        dtype: DType,
        what: &'static str,
        offset: u64,
    },

    /// A ggml type id weft does not know.
    #[error("[gguf] tensor `{name}`: unknown type id {type_id} at byte 0x{offset:x}")]
    UnknownTensorType {
        name: String,
        type_id: u32,
        offset: u64,
    },

    /// A row that is not a whole number of quantization blocks.
    #[error(
        "[gguf] tensor `{name}` at byte 0x{offset:x}: first dimension {ne0} is not a multiple of \
         the block length {block_len} of type {dtype}"
    )]
    PartialBlock {
        name: String,
        ne0: u64,
        dtype: DType,
        block_len: u64,
        offset: u64,
    },

    /// A tensor data offset that is not a multiple of the alignment.
    #[error(
        "[gguf] tensor `{name}`: data offset 0x{data_offset:x} (field at byte 0x{offset:x}) is not \
         a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        name: String,
        data_offset: u64,
        alignment: u64,
        offset: u64,
    },

    /// Tensor data that does not lie inside the file.
    #[error(
        "[gguf] tensor `{name}` data 0x{start:x}..0x{end:x} lies outside the file ({len} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        len: u64,
    },

    /// Two tensors whose data share bytes.
    #[error(
        "[gguf] tensor `{name}` data 0x{start:x}..0x{end:x} overlaps the data of tensor `{other}` \
         (0x{other_start:x}..0x{other_end:x}); every tensor needs bytes of its own"
    )]
    TensorOverlap {
        name: String,
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },

    /// A metadata value of the wrong type for a typed accessor.
    #[error(
        "[gguf] metadata key `{key}` (at byte 0x{offset:x}) has type {found}, expected {expected}"
    )]
    WrongType {
        key: String,
        found: String,
        expected: &'static str,
        offset: u64,
    },

    /// An integer metadata value that does not fit the requested type.
    #[error("[gguf] metadata key `{key}` (at byte 0x{offset:x}) holds {value}, which does not fit in {expected}")]
    OutOfRange {
        key: String,
        value: String,
        expected: &'static str,
        offset: u64,
    },

    /// A metadata key a caller requires is absent.
    #[error("[gguf] missing metadata key `{key}`")]
    MissingKey { key: String },

    /// The writer was given something it cannot write as valid GGUF.
    #[error("[gguf::writer] {what}")]
    Writer { what: String },
}

impl GgufError {
    /// Shorthand for a writer error.
    pub(crate) fn writer(what: impl Into<String>) -> GgufError {
        GgufError::Writer { what: what.into() }
    }
}
