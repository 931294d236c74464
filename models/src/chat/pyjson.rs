//! Python's `json.dumps` for template values: the `tojson` filter of
//! `transformers` (`ensure_ascii=False` unless asked, `indent`,
//! `separators`, `sort_keys`). minijinja's own `tojson` escapes `<`, `>`,
//! `&` and `'` for HTML and spaces items differently, which would change
//! the prompts of templates that write tool definitions as JSON.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `json.dumps` options.
#[derive(Clone, Debug, Default)]
pub struct Style {
    pub indent: Option<usize>,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
    /// (between items, between a key and its value); default `(", ", ": ")`,
    /// or `(",", ": ")` with an indent, as in Python.
    pub separators: Option<(String, String)>,
}

/// Nesting deeper than this is refused (Python's recursion limit is near).
const MAX_DEPTH: usize = 512;

/// `value` as `json.dumps(value, ...)` writes it.
pub fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
    let (item, key) = match &style.separators {
        Some((i, k)) => (i.clone(), k.clone()),
        None if style.indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut w = Writer {
        out: String::new(),
        style,
        item,
        key,
    };
    w.value(value, 0)?;
    Ok(w.out)
}

struct Writer<'a> {
    out: String,
    style: &'a Style,
    item: String,
    key: String,
}

fn unserializable(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: {what} is not JSON serializable"),
    )
}

impl Writer<'_> {
    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(unserializable(&format!(
                "a value nested more than {MAX_DEPTH} levels deep"
            )));
        }
        match v.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => self.out.push_str(&v.to_string()),
            ValueKind::Number => {
                let f = f64::try_from(v.clone())?;
                self.out.push_str(&float_repr(f));
            }
            ValueKind::String => {
                let s = v.to_str().unwrap_or_default();
                self.string(&s);
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth);
                    self.value(item, depth + 1)?;
                }
                self.close(']', items.is_empty(), depth);
            }
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for k in v.try_iter()? {
                    let value = v.get_item(&k)?;
                    pairs.push((key_text(&k)?, value));
                }
                if self.style.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.out.push('{');
                for (i, (k, value)) in pairs.iter().enumerate() {
                    self.separate(i, depth);
                    self.string(k);
                    let sep = self.key.clone();
                    self.out.push_str(&sep);
                    self.value(value, depth + 1)?;
                }
                self.close('}', pairs.is_empty(), depth);
            }
            ValueKind::Undefined => return Err(unserializable("an undefined value")),
            other => return Err(unserializable(&format!("a value of kind {other}"))),
        }
        Ok(())
    }

    fn separate(&mut self, index: usize, depth: usize) {
        if index > 0 {
            let sep = self.item.clone();
            self.out.push_str(&sep);
        }
        if let Some(n) = self.style.indent {
            self.out.push('\n');
            self.out.extend(std::iter::repeat_n(' ', n * (depth + 1)));
        }
    }

    fn close(&mut self, c: char, empty: bool, depth: usize) {
        if let (Some(n), false) = (self.style.indent, empty) {
            self.out.push('\n');
            self.out.extend(std::iter::repeat_n(' ', n * depth));
        }
        self.out.push(c);
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.style.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// A map key as Python's `json` writes it: strings as they are, numbers,
/// booleans and `None` by their JSON text.
fn key_text(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.to_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number if k.is_integer() => Ok(k.to_string()),
        ValueKind::Number => Ok(float_repr(f64::try_from(k.clone())?)),
        other => Err(unserializable(&format!("a map key of kind {other}"))),
    }
}

/// Python's `float.__repr__` (what `json.dumps` writes): the shortest text
/// that reads back the same, positional for exponents -4 to 15, else
/// `1e+16` style; `NaN`, `Infinity`, `-Infinity` as `json.dumps` allows.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` is the shortest round-trip digits: `-1.2345e-7`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_writes_them() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (123.5, "123.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (-2.5e20, "-2.5e+20"),
            (1234567890123456.0, "1234567890123456.0"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn containers_and_strings_as_json_dumps() {
        let v = Value::from_iter([Value::from(1), Value::from("a\"\n\u{1}é"), Value::from(())]);
        assert_eq!(
            dumps(&v, &Style::default()).unwrap(),
            "[1, \"a\\\"\\n\\u0001é\", null]"
        );
        let ascii = Style {
            ensure_ascii: true,
            ..Style::default()
        };
        assert_eq!(
            dumps(&Value::from("é😀"), &ascii).unwrap(),
            "\"\\u00e9\\ud83d\\ude00\""
        );
        let m = Value::from(std::collections::BTreeMap::from([
            ("b", Value::from(1)),
            ("a", Value::from_iter([2, 3])),
        ]));
        let pretty = Style {
            indent: Some(2),
            sort_keys: true,
            ..Style::default()
        };
        assert_eq!(
            dumps(&m, &pretty).unwrap(),
            "{\n  \"a\": [\n    2,\n    3\n  ],\n  \"b\": 1\n}"
        );
        let empty = Value::from_iter(Vec::<Value>::new());
        assert_eq!(dumps(&empty, &pretty).unwrap(), "[]");
        assert!(dumps(&Value::UNDEFINED, &Style::default()).is_err());
    }
}
