//! Typed metadata accessors of [`GgufFile`].
//!
//! `get_*` returns `Ok(None)` when the key is absent and an error naming the
//! key, the type found and the entry's byte offset when the type is wrong.
//! Integer accessors accept any integer type whose value fits; float
//! accessors accept floats and integers. `require_*` turns absence into
//! "missing metadata key".

use std::borrow::Cow;

use super::error::GgufError;
use super::value::{Array, Value};
use super::GgufFile;

impl GgufFile {
    /// An integer value converted to `T` when it fits.
    fn get_integer<T: TryFrom<i128>>(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<Option<T>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        let Some(v) = value.as_integer() else {
            return Err(wrong_type(key, value, expected, offset));
        };
        T::try_from(v).map(Some).map_err(|_| GgufError::OutOfRange {
            key: key.into(),
            value: format!("{v} ({})", value.type_description()),
            expected,
            offset,
        })
    }

    /// An integer that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get_integer(key, "u32")
    }

    /// An integer that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get_integer(key, "u64")
    }

    /// An integer that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.get_integer(key, "i64")
    }

    /// A float or integer, as `f32`.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        Ok(self.get_f64_as(key, "f32")?.map(|v| v as f32))
    }

    /// A float or integer, as `f64`.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.get_f64_as(key, "f64")
    }

    fn get_f64_as(&self, key: &str, expected: &'static str) -> Result<Option<f64>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        value
            .as_f64()
            .map(Some)
            .ok_or_else(|| wrong_type(key, value, expected, offset))
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        match value {
            Value::Bool(b) => Ok(Some(*b)),
            other => Err(wrong_type(key, other, "bool", offset)),
        }
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        value
            .as_str()
            .map(Some)
            .ok_or_else(|| wrong_type(key, value, "string", offset))
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        value
            .as_array()
            .map(Some)
            .ok_or_else(|| wrong_type(key, value, "array", offset))
    }

    /// An array of strings (a tokenizer vocabulary, merges), borrowed.
    pub fn get_str_array(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        match value {
            Value::Array(Array::String(v)) => Ok(Some(v)),
            other => Err(wrong_type(key, other, "array<string>", offset)),
        }
    }

    /// An array of `f32` (borrowed) or `f64` (converted).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Cow<'_, [f32]>>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        match value {
            Value::Array(Array::F32(v)) => Ok(Some(Cow::Borrowed(v))),
            Value::Array(Array::F64(v)) => {
                Ok(Some(Cow::Owned(v.iter().map(|&x| x as f32).collect())))
            }
            other => Err(wrong_type(key, other, "array<f32>", offset)),
        }
    }

    /// An array of `i32` (borrowed), or of another integer type whose every
    /// element fits (converted).
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Cow<'_, [i32]>>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        match value {
            Value::Array(Array::I32(v)) => Ok(Some(Cow::Borrowed(v))),
            other => {
                convert_integers(key, other, "array<i32>", offset).map(|v| Some(Cow::Owned(v)))
            }
        }
    }

    /// An array of `u32` (borrowed), or of another integer type whose every
    /// element fits (converted).
    pub fn get_u32_array(&self, key: &str) -> Result<Option<Cow<'_, [u32]>>, GgufError> {
        let Some((value, offset)) = self.entry(key) else {
            return Ok(None);
        };
        match value {
            Value::Array(Array::U32(v)) => Ok(Some(Cow::Borrowed(v))),
            other => {
                convert_integers(key, other, "array<u32>", offset).map(|v| Some(Cow::Owned(v)))
            }
        }
    }

    /// Like [`GgufFile::get_u32`], but absence is an error.
    pub fn require_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_u32(key)?.ok_or_else(|| missing(key))
    }

    /// Like [`GgufFile::get_u64`], but absence is an error.
    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_u64(key)?.ok_or_else(|| missing(key))
    }

    /// Like [`GgufFile::get_f32`], but absence is an error.
    pub fn require_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.get_f32(key)?.ok_or_else(|| missing(key))
    }

    /// Like [`GgufFile::get_str`], but absence is an error.
    pub fn require_str(&self, key: &str) -> Result<&str, GgufError> {
        self.get_str(key)?.ok_or_else(|| missing(key))
    }

    /// `general.architecture` (`"llama"`, `"gemma3"`, ...).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.require_str("general.architecture")
    }
}

fn wrong_type(key: &str, found: &Value, expected: &'static str, offset: u64) -> GgufError {
    GgufError::WrongType {
        key: key.into(),
        found: found.type_description(),
        expected,
        offset,
    }
}

fn missing(key: &str) -> GgufError {
    GgufError::MissingKey { key: key.into() }
}

/// Every element of an integer array converted to `T`, or an error naming
/// the first element that does not fit.
fn convert_integers<T: TryFrom<i128>>(
    key: &str,
    value: &Value,
    expected: &'static str,
    offset: u64,
) -> Result<Vec<T>, GgufError> {
    let array = match value {
        Value::Array(a) if a.is_integer() => a,
        other => return Err(wrong_type(key, other, expected, offset)),
    };
    let mut out = Vec::with_capacity(array.len());
    for index in 0..array.len() {
        let v = array.integer_at(index).unwrap_or_default();
        let converted = T::try_from(v).map_err(|_| GgufError::OutOfRange {
            key: key.into(),
            value: format!("element {index} = {v} ({})", array.type_description()),
            expected,
            offset,
        })?;
        out.push(converted);
    }
    Ok(out)
}
