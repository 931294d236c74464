//! A recorded node: an op name, a label, a layer, and its exact byte ranges.

use crate::range::ByteRange;
use crate::GraphError;
use std::borrow::Cow;

/// Human-readable name of a node, e.g. `attn_q` or `blk.3.ffn_down`.
pub type Label = Cow<'static, str>;

/// One dispatch in a recording. `reads` and `writes` are complete: the reorder
/// pass trusts them, so a kernel touching bytes it did not declare is a bug.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: &'static str,
    pub label: Label,
    pub layer: Option<u32>,
    pub reads: Vec<ByteRange>,
    pub writes: Vec<ByteRange>,
}

impl Node {
    /// Builds a node from optional range lists, refusing what reorder mode
    /// cannot trust: missing lists, no writes at all, empty ranges.
    pub fn checked(
        op: &'static str,
        label: Label,
        layer: Option<u32>,
        reads: Option<Vec<ByteRange>>,
        writes: Option<Vec<ByteRange>>,
    ) -> Result<Self, GraphError> {
        let reads = reads.ok_or_else(|| GraphError::MissingReads {
            op,
            label: label.to_string(),
        })?;
        let writes = match writes {
            Some(w) if !w.is_empty() => w,
            _ => {
                return Err(GraphError::MissingWrites {
                    op,
                    label: label.to_string(),
                })
            }
        };
        if let Some(bad) = reads.iter().chain(&writes).find(|r| r.is_empty()) {
            return Err(GraphError::BadRange {
                op,
                label: label.to_string(),
                range: *bad,
            });
        }
        Ok(Self {
            op,
            label,
            layer,
            reads,
            writes,
        })
    }

    /// True when `self` and `other` touch a common byte and one of them writes it.
    pub fn conflicts_with(&self, other: &Node) -> bool {
        let hits =
            |a: &[ByteRange], b: &[ByteRange]| a.iter().any(|x| b.iter().any(|y| x.overlaps(y)));
        hits(&self.writes, &other.writes)
            || hits(&self.writes, &other.reads)
            || hits(&self.reads, &other.writes)
    }

    /// Total bytes named by the node's ranges (reads plus writes).
    pub fn bytes_touched(&self) -> u64 {
        self.reads
            .iter()
            .chain(&self.writes)
            .map(ByteRange::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BufferId;

    fn r(b: u32, s: u64, e: u64) -> ByteRange {
        ByteRange::new(BufferId(b), s, e)
    }

    #[test]
    fn missing_ranges_are_refused_with_op_and_label() {
        let e = Node::checked(
            "matmul",
            "blk.0.attn_q".into(),
            Some(0),
            None,
            Some(vec![r(0, 0, 4)]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("matmul") && e.contains("blk.0.attn_q"), "{e}");
        let e = Node::checked(
            "rope",
            "blk.1.rope_k".into(),
            Some(1),
            Some(vec![]),
            Some(vec![]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rope") && e.contains("blk.1.rope_k"), "{e}");
        let e = Node::checked(
            "add",
            "x".into(),
            None,
            Some(vec![r(0, 4, 4)]),
            Some(vec![r(1, 0, 4)]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("empty or inverted"), "{e}");
    }

    #[test]
    fn read_read_is_not_a_conflict() {
        let a = Node::checked(
            "x",
            "a".into(),
            None,
            Some(vec![r(0, 0, 8)]),
            Some(vec![r(1, 0, 8)]),
        )
        .unwrap();
        let b = Node::checked(
            "x",
            "b".into(),
            None,
            Some(vec![r(0, 4, 12)]),
            Some(vec![r(2, 0, 8)]),
        )
        .unwrap();
        let c = Node::checked(
            "x",
            "c".into(),
            None,
            Some(vec![r(1, 7, 9)]),
            Some(vec![r(3, 0, 8)]),
        )
        .unwrap();
        assert!(!a.conflicts_with(&b));
        assert!(a.conflicts_with(&c));
        assert!(c.conflicts_with(&a));
    }
}
