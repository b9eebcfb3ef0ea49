//! URL text: the one redactor and the one percent-decoder.

use percent_encoding::percent_decode_str;

/// `url` with the password of its user information replaced by `***`, for
/// messages. Works on multi-host URLs (`redis+cluster://u:p@h1,h2`,
/// `etcd://u:p@e1,e2`), which the url crate cannot parse, by cutting the
/// authority by hand; when the password cannot be located for sure (an `@`
/// past the authority: a password with an unencoded `/`, `?` or `#`),
/// nothing past the scheme is shown.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "…".to_owned();
    };
    match super::split_authority(rest) {
        (Some(user_info), hosts, tail) => {
            let user = match user_info.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => user_info.to_owned(),
            };
            format!("{scheme}://{user}@{hosts}{tail}")
        }
        (None, _, tail) if tail.contains('@') => format!("{scheme}://…"),
        (None, ..) => url.to_owned(),
    }
}

/// Percent-decodes a part of a URL (user, password, path, parameter).
pub(crate) fn decode(text: &str) -> std::result::Result<String, &'static str> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| "not UTF-8 after percent-decoding")
}

/// A URL's user name and password, percent-decoded; empty ones are
/// `None`. The error names which of them is malformed, never its text.
pub(crate) fn decoded_credentials(
    user: &str,
    password: Option<&str>,
) -> std::result::Result<(Option<String>, Option<super::Password>), String> {
    let user = decoded(user).map_err(|e| format!("user name: {e}"))?;
    let password = match password {
        Some(text) => decoded(text).map_err(|e| format!("password: {e}"))?,
        None => None,
    };
    Ok((user, password.map(super::Password::new)))
}

/// [`decode`], `None` if empty (a URL's user name or password).
pub(crate) fn decoded(text: &str) -> std::result::Result<Option<String>, &'static str> {
    Ok(Some(decode(text)?).filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive_redaction() {
        let cases = [
            ("redis://u:secret@h:1/0", "redis://u:***@h:1/0"),
            ("redis://h:1", "redis://h:1"),
            (
                "redis+cluster://u:secret@h1:1,h2:2/?prefix=a",
                "redis+cluster://u:***@h1:1,h2:2/?prefix=a",
            ),
            ("redis+cluster://h1,h2", "redis+cluster://h1,h2"),
            ("redis://u:se/cret@h", "redis://…"),
            (
                "etcd://bob:secret@h:1,g:2/?prefix=x",
                "etcd://bob:***@h:1,g:2/?prefix=x",
            ),
            ("postgres://app@db/x", "postgres://app@db/x"),
            ("no scheme secret", "…"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
        }
        assert!(!redact("redis://u:se cret@[bad").contains("se cret"));
    }

    #[test]
    fn decoding_keeps_utf8_and_empties_are_none() {
        assert_eq!(decode("p%40ss%3A"), Ok("p@ss:".to_owned()));
        assert_eq!(decoded(""), Ok(None));
        assert!(decode("%ff").is_err());
    }
}
