//! Hyper-parameters read from GGUF metadata, each checked before anything
//! is sized by it.
//!
//! A model file is untrusted input: a count in its metadata can say
//! anything, and a loader that sizes a loop, a cache or an allocation by it
//! does unbounded work for a file of a few bytes. So every count a model
//! family reads goes through [`Hparams`] with an upper bound taken from the
//! file itself (the blocks whose tensors it holds, the largest tensor
//! dimension, the context length) or, where nothing in the file bounds it,
//! a documented hard limit ([`MAX_WIDTH`] and the family's own). Every float
//! must be finite and inside the range where it means something. Errors
//! name the key, the value found and what is accepted.
//!
//! The bounds only refuse what cannot be right; the exact agreement of the
//! metadata with the tensors is checked as the weights load (their shapes)
//! and after (every tensor used).

use crate::gguf::GgufFile;
use crate::ModelError;

/// Largest width weft accepts for any dimension-like count (hidden size,
/// heads, head dim, experts, ...), whatever the tensors say: 16 Mi, far
/// above any published model, and small enough that a product of two such
/// counts cannot overflow.
pub const MAX_WIDTH: usize = 1 << 24;

/// The range a float hyper-parameter must lie in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatRange {
    /// Finite and `> 0` (scaling factors, scales).
    Positive,
    /// Finite and `> 1` (a RoPE base: its logarithm divides).
    AboveOne,
    /// Finite and `>= 0` (clamps and caps, where 0 means "off").
    NonNegative,
    /// An epsilon: finite, `> 0` and `< 1`.
    Epsilon,
}

impl FloatRange {
    fn accepts(self, v: f64) -> bool {
        v.is_finite()
            && match self {
                FloatRange::Positive => v > 0.0,
                FloatRange::AboveOne => v > 1.0,
                FloatRange::NonNegative => v >= 0.0,
                FloatRange::Epsilon => v > 0.0 && v < 1.0,
            }
    }

    fn describe(self) -> &'static str {
        match self {
            FloatRange::Positive => "a finite number > 0",
            FloatRange::AboveOne => "a finite number > 1",
            FloatRange::NonNegative => "a finite number >= 0",
            FloatRange::Epsilon => "a finite number > 0 and < 1",
        }
    }
}

/// The error for metadata key `key` holding `value` where `accepted` is.
pub(crate) fn bad_value(
    key: &str,
    value: impl std::fmt::Display,
    accepted: impl Into<String>,
) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        value: value.to_string(),
        accepted: accepted.into(),
    }
}

/// Checked access to the `{arch}.*` hyper-parameters of one file.
pub struct Hparams<'f> {
    file: &'f GgufFile,
    arch: String,
    blocks: usize,
    widest: usize,
}

impl<'f> Hparams<'f> {
    /// The hyper-parameters of `file` under prefix `arch`.
    pub fn new(file: &'f GgufFile, arch: &str) -> Hparams<'f> {
        Hparams {
            file,
            arch: arch.to_string(),
            blocks: blocks_in_file(file),
            widest: widest_dimension(file).min(MAX_WIDTH),
        }
    }

    /// The full key of `k` (`block_count` -> `llama.block_count`).
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// Blocks whose tensors the file holds: one more than the largest `N`
    /// of a `blk.N.*` tensor.
    pub fn blocks_in_file(&self) -> usize {
        self.blocks
    }

    /// The largest dimension of any non-empty tensor (at most [`MAX_WIDTH`]):
    /// no width of the model can exceed it.
    pub fn widest(&self) -> usize {
        self.widest
    }

    /// Count `k` in `min..=max` (`bound` says where `max` comes from);
    /// `default` when absent (`None`: the key is required).
    pub fn count(
        &self,
        k: &str,
        default: Option<usize>,
        min: usize,
        max: usize,
        bound: &str,
    ) -> Result<usize, ModelError> {
        let key = self.key(k);
        let value = match self.file.get_u64(&key)? {
            Some(v) => v,
            None => match default {
                Some(d) => return Ok(d),
                None => return Err(crate::gguf::GgufError::MissingKey { key }.into()),
            },
        };
        match usize::try_from(value) {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(bad_value(&key, value, format!("{min} to {max} ({bound})"))),
        }
    }

    /// The number of blocks, `1..=` the blocks the file holds tensors of.
    pub fn block_count(&self) -> Result<usize, ModelError> {
        let have = self.blocks;
        self.count(
            "block_count",
            None,
            1,
            have.max(1),
            &format!("the file holds the tensors of {have} blocks"),
        )
    }

    /// A width (`1..=` the widest tensor dimension); `default` when absent.
    pub fn width(&self, k: &str, default: Option<usize>) -> Result<usize, ModelError> {
        self.count(
            k,
            default,
            1,
            self.widest.max(1),
            "no tensor of the file is wider",
        )
    }

    /// Like [`Hparams::width`], but 0 is accepted (a feature that is off).
    pub fn width_or_zero(&self, k: &str, default: usize) -> Result<usize, ModelError> {
        self.count(
            k,
            Some(default),
            0,
            self.widest,
            "no tensor of the file is wider",
        )
    }

    /// The context length the model was trained for (`1..=u32::MAX`).
    pub fn context(&self, default: u32) -> Result<u32, ModelError> {
        let v = self.count(
            "context_length",
            Some(default as usize),
            1,
            u32::MAX as usize,
            "a token position is a u32",
        )?;
        Ok(v as u32)
    }

    /// The RoPE dimension count for heads of `head_dim`: even, `2..=head_dim`.
    pub fn rope_dims(&self, head_dim: usize) -> Result<usize, ModelError> {
        let key = self.key("rope.dimension_count");
        let n = self.count("rope.dimension_count", Some(head_dim), 0, usize::MAX, "")?;
        if n < 2 || n > head_dim || !n.is_multiple_of(2) {
            return Err(bad_value(
                &key,
                n,
                format!("an even number from 2 to the head dimension {head_dim}"),
            ));
        }
        Ok(n)
    }

    /// Float `k` in `range`; `default` when absent.
    pub fn float(&self, k: &str, default: f32, range: FloatRange) -> Result<f32, ModelError> {
        let key = self.key(k);
        match self.file.get_f64(&key)? {
            None => Ok(default),
            Some(v) if range.accepts(v) && range.accepts(v as f32 as f64) => Ok(v as f32),
            Some(v) => Err(bad_value(&key, v, range.describe())),
        }
    }

    /// Per-layer floats `k` (the first `layers` entries, each in `range`);
    /// `default` for every layer when absent.
    pub fn layer_floats(
        &self,
        k: &str,
        layers: usize,
        default: f32,
        range: FloatRange,
    ) -> Result<Vec<f32>, ModelError> {
        let key = self.key(k);
        let Some(v) = self.file.get_f32_array(&key)? else {
            return Ok(vec![default; layers]);
        };
        if v.len() < layers {
            return Err(bad_value(
                &key,
                format!("an array of {} entries", v.len()),
                format!("one entry per layer ({layers})"),
            ));
        }
        let v = &v[..layers];
        if let Some((i, x)) = v
            .iter()
            .enumerate()
            .find(|(_, x)| !range.accepts(**x as f64))
        {
            return Err(bad_value(
                &key,
                format!("{x} at entry {i}"),
                format!("every entry {}", range.describe()),
            ));
        }
        Ok(v.to_vec())
    }
}

/// One more than the largest `N` of a `blk.N.*` tensor (0 without any).
fn blocks_in_file(file: &GgufFile) -> usize {
    file.tensors()
        .iter()
        .filter_map(|t| block_of(&t.name))
        .max()
        .map_or(0, |n| n.saturating_add(1))
}

/// The block index of a `blk.N.*` tensor name.
pub(crate) fn block_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// The largest dimension of any tensor holding at least one element.
fn widest_dimension(file: &GgufFile) -> usize {
    file.tensors()
        .iter()
        .filter(|t| t.n_elements() > 0)
        .flat_map(|t| t.dims.iter().copied())
        .max()
        .map_or(0, |d| usize::try_from(d).unwrap_or(usize::MAX))
}
