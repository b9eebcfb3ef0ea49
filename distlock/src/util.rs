//! Small helpers shared by backends and the URL dispatcher. A leaf module:
//! it uses nothing else of the crate, so any module may import it (as
//! object_store's `util.rs`).

use std::fmt::Write;

use sha2::{Digest, Sha256};
use url::Url;

/// The one short digest distlock derives from strings: lock-file names and
/// the owner digests Postgres records both use it.
///
/// Lowercase hex of the first 128 bits of SHA-256 of `data` (32 characters).
/// 128 bits keep accidental collisions out of reach (about n² / 2¹²⁹ for n
/// inputs) in half the length of the full digest.
pub(crate) fn sha256_hex128(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut hex = String::with_capacity(32);
    for byte in &digest[..16] {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// The URL with any password replaced by `***`, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // Unparseable: the password cannot be located, so show nothing past the scheme.
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…"),
            None => "…".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_the_leading_half_of_the_sha256_hex() {
        // sha256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a396177a9cb410ff61f20015ad
        assert_eq!(sha256_hex128(b"abc"), "ba7816bf8f01cfea414140de5dae2223");
    }
}
