//! GGUF metadata values: the thirteen value types, scalars and typed arrays.
//!
//! Arrays are stored as one `Vec` of the element type (`Array::F32(Vec<f32>)`,
//! `Array::String(Vec<String>)`, ...), never as a `Vec<Value>`, so a 262k-entry
//! tokenizer vocabulary is one allocation per string and nothing more.

use std::fmt;

/// GGUF value type ids (`gguf_type` in the spec).
pub mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed array: every element has the type of the variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// An array of arrays; each inner array carries its own element type.
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// Bytes one element of a fixed-size type takes in the file, `None` for
/// strings and arrays (variable size) and unknown ids.
pub(crate) fn fixed_size(type_id: u32) -> Option<u64> {
    match type_id {
        type_id::U8 | type_id::I8 | type_id::BOOL => Some(1),
        type_id::U16 | type_id::I16 => Some(2),
        type_id::U32 | type_id::I32 | type_id::F32 => Some(4),
        type_id::U64 | type_id::I64 | type_id::F64 => Some(8),
        _ => None,
    }
}

/// The fewest bytes one element of `type_id` can take in the file: a string
/// has at least its 8-byte length, an array at least its type and length.
pub(crate) fn min_size(type_id: u32) -> Option<u64> {
    match type_id {
        type_id::STRING => Some(8),
        type_id::ARRAY => Some(12),
        other => fixed_size(other),
    }
}

/// Spec name of a value type id (`"u32"`, `"string"`, ...).
pub fn type_name(id: u32) -> &'static str {
    match id {
        type_id::U8 => "u8",
        type_id::I8 => "i8",
        type_id::U16 => "u16",
        type_id::I16 => "i16",
        type_id::U32 => "u32",
        type_id::I32 => "i32",
        type_id::F32 => "f32",
        type_id::BOOL => "bool",
        type_id::STRING => "string",
        type_id::ARRAY => "array",
        type_id::U64 => "u64",
        type_id::I64 => "i64",
        type_id::F64 => "f64",
        _ => "unknown",
    }
}

impl Value {
    /// The GGUF type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::F32(_) => type_id::F32,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) => type_id::ARRAY,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F64(_) => type_id::F64,
        }
    }

    /// Human-readable type, with the element type for arrays
    /// (`"array<string>"`), for error messages.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => a.type_description(),
            other => type_name(other.type_id()).to_string(),
        }
    }

    /// The value as a signed 128-bit integer when it is any integer type.
    pub fn as_integer(&self) -> Option<i128> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::I8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::U64(v) => Some(v.into()),
            Value::I64(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as `f64` when it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_integer().map(|v| v as f64),
        }
    }

    /// The string when the value is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array when the value is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    /// The GGUF type id of the elements.
    pub fn element_type_id(&self) -> u32 {
        match self {
            Array::U8(_) => type_id::U8,
            Array::I8(_) => type_id::I8,
            Array::U16(_) => type_id::U16,
            Array::I16(_) => type_id::I16,
            Array::U32(_) => type_id::U32,
            Array::I32(_) => type_id::I32,
            Array::F32(_) => type_id::F32,
            Array::Bool(_) => type_id::BOOL,
            Array::String(_) => type_id::STRING,
            Array::Array(_) => type_id::ARRAY,
            Array::U64(_) => type_id::U64,
            Array::I64(_) => type_id::I64,
            Array::F64(_) => type_id::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `"array<f32>"`, `"array<array>"`, ... for error messages.
    pub fn type_description(&self) -> String {
        format!("array<{}>", type_name(self.element_type_id()))
    }

    /// Element `index` as an `i128` when the elements are integers.
    pub(crate) fn integer_at(&self, index: usize) -> Option<i128> {
        match self {
            Array::U8(v) => v.get(index).map(|&x| x.into()),
            Array::I8(v) => v.get(index).map(|&x| x.into()),
            Array::U16(v) => v.get(index).map(|&x| x.into()),
            Array::I16(v) => v.get(index).map(|&x| x.into()),
            Array::U32(v) => v.get(index).map(|&x| x.into()),
            Array::I32(v) => v.get(index).map(|&x| x.into()),
            Array::U64(v) => v.get(index).map(|&x| x.into()),
            Array::I64(v) => v.get(index).map(|&x| x.into()),
            _ => None,
        }
    }

    /// True when the elements are of an integer type.
    pub(crate) fn is_integer(&self) -> bool {
        matches!(
            self,
            Array::U8(_)
                | Array::I8(_)
                | Array::U16(_)
                | Array::I16(_)
                | Array::U32(_)
                | Array::I32(_)
                | Array::U64(_)
                | Array::I64(_)
        )
    }
}

impl fmt::Display for Value {
    /// Scalars print as themselves, strings quoted, arrays as their type and
    /// length (a vocabulary would not fit in an error message).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(a) => write!(f, "{} of {} elements", a.type_description(), a.len()),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// `From` conversions so writers can say `w.set("llama.block_count", 30u32)`.
macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$variant(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}

value_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_owned())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(str::to_owned).collect()))
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Value {
        Value::Array(v)
    }
}

impl From<Vec<Array>> for Value {
    fn from(v: Vec<Array>) -> Value {
        Value::Array(Array::Array(v))
    }
}
