//! Byte sizes as people type them on HPC command lines ("64M", "1MiB", "4k", "4096").
//!
//! The one parser of sizes: configuration values, `benchfs-run` flags and sweep files (through
//! `benchfs._core.parse_size`) all use it. Every suffix is binary (K = KiB = KB = 1024), as in
//! IOR and fio, so "1M" is never ambiguous.

/// What a size may look like, for error messages.
pub const SIZE_SYNTAX: &str =
    "a whole number of bytes with an optional suffix K, M, G, T or P (binary; KiB, MB etc. also accepted)";

/// Parses "64M", "1MiB", "4096", "2g" or "512B" into bytes. The error says why, without the
/// value's name (the caller knows it).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err("a size must not be negative".into());
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(format!("expected {SIZE_SYNTAX}"));
    }
    let (number, suffix) = t.split_at(digits);
    let suffix = suffix.trim_start().to_ascii_lowercase();
    let shift = match suffix.as_str() {
        "" | "b" => 0,
        s => {
            let unit = s.as_bytes()[0];
            let rest = &s[1..];
            let power = match unit {
                b'k' => 1,
                b'm' => 2,
                b'g' => 3,
                b't' => 4,
                b'p' => 5,
                _ => return Err(format!("unknown suffix {:?}: expected {SIZE_SYNTAX}", &suffix)),
            };
            if !matches!(rest, "" | "b" | "ib") {
                return Err(format!("unknown suffix {suffix:?}: expected {SIZE_SYNTAX}"));
            }
            10 * power
        }
    };
    let value: u64 = number.parse().map_err(|_| "too large for 64 bits".to_string())?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| "too large for 64 bits".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_binary() {
        for (text, want) in [
            ("4096", 4096),
            ("0", 0),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("1MB", 1 << 20),
            ("1m", 1 << 20),
            (" 64 k ", 64 << 10),
            ("2g", 2 << 30),
            ("3T", 3 << 40),
            ("1P", 1 << 50),
            ("512B", 512),
            ("16383P", 16383 << 50),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_sizes_say_why() {
        let err = |t: &str| parse_size(t).err().unwrap_or_default();
        assert!(err("-5").contains("negative"));
        assert!(err("-1M").contains("negative"));
        assert!(err("1X").contains("unknown suffix \"x\""));
        assert!(err("1Mx").contains("unknown suffix \"mx\""));
        assert!(err("M").contains("expected a whole number"));
        assert!(err("").contains("expected a whole number"));
        assert!(err("1.5M").contains("unknown suffix"));
        assert!(err("16384P").contains("too large"));
        assert!(err("99999999999999999999").contains("too large"));
    }
}
