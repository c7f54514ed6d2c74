//! Lock names: validation and the escaped form backends use in paths and keys.

use std::fmt;
use std::sync::Arc;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

use crate::LockError;

/// The longest lock name accepted, in bytes of UTF-8.
///
/// The escaped form ([`LockName::escaped`]) is at most three times as long, which keeps
/// ZooKeeper paths and Redis keys well inside every server's limits.
pub const MAX_NAME_LEN: usize = 512;

/// Everything except ASCII letters, digits, `-` and `_` is percent-escaped, so that the
/// escaped form is a single path segment that is never `.`, `..` or `zookeeper`, contains no
/// `/`, `{`, `}` or `:`, and maps distinct names to distinct strings.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// Why a lock name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is the empty string.
    #[error("the name is empty")]
    Empty,
    /// The name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("the name is {len} bytes long; the limit is {max} bytes")]
    TooLong {
        /// The name's length in bytes.
        len: usize,
        /// The limit, [`MAX_NAME_LEN`].
        max: usize,
    },
    /// The name contains a NUL character.
    #[error("the name contains a NUL character at byte {index}")]
    Nul {
        /// Byte offset of the first NUL.
        index: usize,
    },
    /// The name contains another control character (U+0001–U+001F, U+007F–U+009F).
    #[error("the name contains the control character {character:?} at byte {index}")]
    ControlCharacter {
        /// Byte offset of the first control character.
        index: usize,
        /// The character.
        character: char,
    },
}

/// A validated lock name.
///
/// Any non-empty UTF-8 string of at most [`MAX_NAME_LEN`] bytes without control characters
/// is a valid name. Names are case-sensitive and compared byte for byte: `"Jobs"` and
/// `"jobs"` are two locks. Characters such as `/`, `.`, `..`, `:`, `{`, spaces and any
/// non-ASCII text are allowed; backends store the [escaped](LockName::escaped) form, so no
/// name can leave its namespace or collide with another.
///
/// A clone shares the text (a reference count), so that a lock handle, its guards and the
/// backend's records of a held lock keep one copy of the name between them.
///
/// ```
/// use lock_core::{LockName, NameError};
///
/// let name = LockName::new("billing/nightly run")?;
/// assert_eq!(name.as_str(), "billing/nightly run");
/// assert_eq!(name.escaped(), "billing%2Fnightly%20run");
///
/// let err = LockName::new("").unwrap_err();
/// assert!(err.to_string().contains("empty"));
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`; the error is [`LockError::InvalidName`] with the reason.
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let name = name.into();
        match validate(&name) {
            Ok(()) => Ok(LockName(Arc::from(name))),
            Err(reason) => Err(LockError::InvalidName {
                name: display_prefix(&name),
                reason,
            }),
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name percent-escaped to ASCII letters, digits, `-`, `_` and `%XX`.
    ///
    /// The mapping is injective and yields one path segment that is safe as a ZooKeeper
    /// node name and inside a Redis hash tag. Backends should build their paths and keys
    /// from this form only, or from [`escaped_within`](Self::escaped_within) where keys are
    /// limited in length: the escaped form of a name of [`MAX_NAME_LEN`] bytes can be
    /// three times as long.
    pub fn escaped(&self) -> String {
        utf8_percent_encode(&self.0, ESCAPED).to_string()
    }

    /// The [escaped](Self::escaped) form when it is at most `max_len` bytes long; otherwise
    /// a form that fits, for stores whose keys or file names are limited (a file system's
    /// 255 bytes, say): as much of the escaped form as leaves room (never cutting a `%XX`),
    /// then `~` and the first 128 bits of the name's SHA-256 in hex.
    ///
    /// The escaped form never contains `~`, so a shortened form never equals another name's
    /// escaped form, and two names share a shortened form only if their hashes collide. The
    /// result is the same in every process and version, so clients agree on it. `None`
    /// when the escaped form does not fit and `max_len` is below [`MIN_SHORTENED_LEN`].
    ///
    /// ```
    /// use lock_core::LockName;
    ///
    /// let short = LockName::new("jobs/nightly")?;
    /// assert_eq!(short.escaped_within(255).as_deref(), Some("jobs%2Fnightly"));
    ///
    /// let long = LockName::new("é".repeat(200))?; // 1,200 bytes escaped
    /// let key = long.escaped_within(255).expect("255 leaves room");
    /// assert!(key.len() <= 255 && key.starts_with("%C3%A9") && key.contains('~'));
    /// assert_eq!(long.escaped_within(10), None);
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    pub fn escaped_within(&self, max_len: usize) -> Option<String> {
        let escaped = self.escaped();
        if escaped.len() <= max_len {
            return Some(escaped);
        }
        let room = max_len.checked_sub(MIN_SHORTENED_LEN)?;
        let mut cut = room.min(escaped.len());
        // Back off to the start of a `%XX` that the cut would split.
        if let Some(percent) = escaped[cut.saturating_sub(2)..cut].rfind('%') {
            cut = cut.saturating_sub(2) + percent;
        }
        let digest = Sha256::digest(self.0.as_bytes());
        let hex: String = digest[..16]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Some(format!("{}~{hex}", &escaped[..cut]))
    }
}

/// The shortest `max_len` that [`LockName::escaped_within`] can meet for every name: `~` and
/// 32 hex digits.
pub const MIN_SHORTENED_LEN: usize = 33;

/// Checks `name` against the naming rules without allocating.
///
/// ```
/// use lock_core::{name::validate, NameError};
/// assert_eq!(validate("a\0b"), Err(NameError::Nul { index: 1 }));
/// assert!(validate("ünïcode / spaces . ok").is_ok());
/// ```
pub fn validate(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    for (index, character) in name.char_indices() {
        if character == '\0' {
            return Err(NameError::Nul { index });
        }
        if character.is_control() {
            return Err(NameError::ControlCharacter { index, character });
        }
    }
    Ok(())
}

/// Keeps error messages readable when the rejected name is huge.
fn display_prefix(name: &str) -> String {
    const SHOWN: usize = 80;
    if name.len() <= SHOWN {
        return name.to_owned();
    }
    let mut end = SHOWN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;
    fn try_from(name: &str) -> Result<Self, LockError> {
        LockName::new(name)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;
    fn try_from(name: String) -> Result<Self, LockError> {
        LockName::new(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_with_reasons() {
        assert_eq!(validate(""), Err(NameError::Empty));
        assert_eq!(validate("x\0"), Err(NameError::Nul { index: 1 }));
        assert_eq!(
            validate("a\u{7}b"),
            Err(NameError::ControlCharacter {
                index: 1,
                character: '\u{7}'
            })
        );
        assert_eq!(
            validate("ab\u{85}"),
            Err(NameError::ControlCharacter {
                index: 2,
                character: '\u{85}'
            })
        );
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            validate(&long),
            Err(NameError::TooLong {
                len: MAX_NAME_LEN + 1,
                max: MAX_NAME_LEN
            })
        );
        assert!(validate(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn error_message_names_the_reason_and_shortens_huge_names() {
        let err = LockName::new("é".repeat(MAX_NAME_LEN)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("limit is 512 bytes"), "{text}");
        assert!(text.len() < 300, "{text}");
        assert!(matches!(
            err,
            LockError::InvalidName {
                reason: NameError::TooLong { .. },
                ..
            }
        ));
    }

    #[test]
    fn escaped_form_is_one_safe_segment() {
        for raw in [
            ".",
            "..",
            "zookeeper",
            "/",
            "a/b",
            "{x}",
            "a:b",
            "%41",
            "lock-0000000001",
        ] {
            let escaped = LockName::new(raw).unwrap().escaped();
            assert!(
                escaped
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'%'),
                "{raw} -> {escaped}"
            );
            assert_ne!(escaped, ".");
            assert_ne!(escaped, "..");
        }
        // `%` itself is escaped, so an escaped-looking name cannot collide with its decoding.
        assert_ne!(
            LockName::new("%41").unwrap().escaped(),
            LockName::new("A").unwrap().escaped()
        );
        assert_eq!(LockName::new("Jobs").unwrap().escaped(), "Jobs");
    }

    #[test]
    fn shortened_forms_fit_and_stay_apart() {
        let a = LockName::new("a".repeat(MAX_NAME_LEN)).unwrap();
        let b = LockName::new(format!("{}b", "a".repeat(MAX_NAME_LEN - 1))).unwrap();
        let (ka, kb) = (
            a.escaped_within(255).unwrap(),
            b.escaped_within(255).unwrap(),
        );
        assert_eq!((ka.len(), kb.len()), (255, 255));
        assert_ne!(ka, kb, "same prefix, different hashes");
        // Stable across processes and versions: a fixed vector.
        let shortest = LockName::new("x".repeat(40))
            .unwrap()
            .escaped_within(MIN_SHORTENED_LEN + 1);
        assert_eq!(
            shortest.as_deref(),
            Some("x~bd913ff68243d41b9611b2690dfbf2b0")
        );
        assert_eq!(a.escaped_within(MIN_SHORTENED_LEN - 1), None);
        // A cut never splits an escape: `%C3%A9` per character.
        let accents = LockName::new("é".repeat(100)).unwrap();
        for max in MIN_SHORTENED_LEN..120 {
            let key = accents.escaped_within(max).unwrap();
            let (prefix, _) = key.split_once('~').unwrap();
            assert!(key.len() <= max, "{key}");
            assert_eq!(prefix.len() % 3, 0, "{max}: {key}");
        }
    }

    proptest! {
        #[test]
        fn escaped_within_fits_and_keeps_names_apart(x in "[a-zé/ ]{1,200}", y in "[a-zé/ ]{1,200}", max in MIN_SHORTENED_LEN..300usize) {
            let (nx, ny) = (LockName::new(x.clone()).unwrap(), LockName::new(y.clone()).unwrap());
            let (kx, ky) = (nx.escaped_within(max).unwrap(), ny.escaped_within(max).unwrap());
            prop_assert!(kx.len() <= max && ky.len() <= max);
            prop_assert_eq!(kx == ky, x == y);
        }

        #[test]
        fn any_string_is_accepted_or_rejected_never_panics(name in any::<String>()) {
            match LockName::new(name.clone()) {
                Ok(valid) => {
                    prop_assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN);
                    prop_assert!(!name.chars().any(char::is_control));
                    prop_assert_eq!(valid.as_str(), name.as_str());
                    let escaped = valid.escaped();
                    let decoded = percent_encoding::percent_decode_str(&escaped).decode_utf8().unwrap();
                    prop_assert_eq!(decoded.as_ref(), name.as_str());
                }
                Err(LockError::InvalidName { reason, .. }) => {
                    prop_assert!(!reason.to_string().is_empty());
                }
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }

        #[test]
        fn distinct_names_escape_to_distinct_segments(a in "\\PC{1,40}", b in "\\PC{1,40}") {
            prop_assume!(a != b);
            let (a, b) = (LockName::new(a).unwrap(), LockName::new(b).unwrap());
            prop_assert_ne!(a.escaped(), b.escaped());
        }

        #[test]
        fn long_strings_never_panic(name in ".{0,700}") {
            let _ = LockName::new(name);
        }
    }
}
