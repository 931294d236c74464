//! Code point classes as llama.cpp's pre-tokenizers see them, and GPT-2's
//! byte-to-unicode mapping.
//!
//! llama.cpp does not use a regex engine's notion of `\p{L}` or `\s`: it has
//! its own tables (Unicode 15.1) and its own whitespace set. Matching it
//! token for token means using the same data, so the general categories come
//! from `unicode_table.rs` (generated from Unicode 15.1 by
//! `scripts/gen_tokenizer_cases.py unicode-table`) and the whitespace set is
//! the Unicode `White_Space` property, listed below.

use super::unicode_table::CATEGORY_RUNS;

/// A general category, collapsed the way llama.cpp collapses it (`\p{N}`,
/// `\p{L}`, ...). `U` is "unassigned" (Cn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Category {
    /// Unassigned (Cn).
    U,
    /// Number (Nd, Nl, No).
    N,
    /// Letter (Lu, Ll, Lt, Lm, Lo).
    L,
    /// Separator (Zs, Zl, Zp).
    Z,
    /// Mark (Mn, Mc, Me).
    M,
    /// Punctuation (Pc, Pd, Ps, Pe, Pi, Pf, Po).
    P,
    /// Symbol (Sm, Sc, Sk, So).
    S,
    /// Other (Cc, Cf, Cs, Co).
    C,
}

/// The general category of `c`.
pub(super) fn category(c: char) -> Category {
    let cp = c as u32;
    // The runs start at 0 and are sorted, so the run holding `cp` is the last
    // one starting at or before it.
    let after = CATEGORY_RUNS.partition_point(|&(start, _)| start <= cp);
    CATEGORY_RUNS[after.saturating_sub(1)].1
}

/// llama.cpp's whitespace: the Unicode `White_Space` property.
pub(super) fn is_whitespace(c: char) -> bool {
    matches!(
        c as u32,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// What a pre-tokenizer asks about one code point. `present` is false only
/// for the "position past the end of the fragment" value, [`Flags::ABSENT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Flags {
    pub category: Category,
    pub whitespace: bool,
    pub present: bool,
}

impl Flags {
    /// Flags of a position outside the current fragment: nothing matches it.
    pub const ABSENT: Flags = Flags {
        category: Category::U,
        whitespace: false,
        present: false,
    };

    pub fn of(c: char) -> Flags {
        Flags {
            category: category(c),
            whitespace: is_whitespace(c),
            present: true,
        }
    }

    pub fn letter(self) -> bool {
        self.present && self.category == Category::L
    }

    pub fn number(self) -> bool {
        self.present && self.category == Category::N
    }

    /// `[^\s\p{L}\p{N}]`: present, and neither whitespace, letter nor number.
    pub fn other(self) -> bool {
        self.present && !self.whitespace && !matches!(self.category, Category::L | Category::N)
    }
}

/// Bytes GPT-2 maps to themselves: `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`.
const fn is_printable_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's byte-to-unicode table: printable bytes map to the code point of
/// the same value, the 68 others to U+0100, U+0101, ... in byte order.
const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if is_printable_byte(b as u8) {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every value here is below U+0200, a valid scalar value.
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
};

/// The inverse of [`BYTE_TO_CHAR`] for the non-printable bytes, indexed by
/// `code point - 0x100`.
const SHIFTED_TO_BYTE: [u8; 68] = {
    let mut table = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !is_printable_byte(b as u8) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

/// The code point GPT-2's byte-level BPE uses for byte `b`.
pub(super) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte a GPT-2 code point stands for, `None` for code points outside
/// the mapping.
pub(super) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x100 && is_printable_byte(cp as u8) {
        return Some(cp as u8);
    }
    let index = cp.checked_sub(0x100)? as usize;
    SHIFTED_TO_BYTE.get(index).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_mapping_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn categories() {
        assert_eq!(category('a'), Category::L);
        assert_eq!(category('7'), Category::N);
        assert_eq!(category(' '), Category::Z);
        assert_eq!(category('\n'), Category::C);
        assert_eq!(category('!'), Category::P);
        assert_eq!(category('$'), Category::S);
        assert_eq!(category('語'), Category::L);
        assert_eq!(category('½'), Category::N);
        assert_eq!(category('\u{301}'), Category::M);
        // Unassigned in Unicode 15.1 (assigned in 16.0): llama.cpp says Cn.
        assert_eq!(category('\u{897}'), Category::U);
        assert_eq!(category('\u{10FFFF}'), Category::U);
        assert!(
            is_whitespace('\u{3000}') && !is_whitespace('\u{200B}') && !is_whitespace('\u{1C}')
        );
    }
}
