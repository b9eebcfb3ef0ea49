//! Labels derived from a command line, with secret-looking values redacted
//! (see the [parent module](super#what-a-label-derived-from-a-command-line-keeps)).

use std::sync::{Arc, OnceLock};

use super::MAX_LABEL_LEN;

/// The process's command line as [`command_label`] makes it, read once.
pub(super) fn command_line() -> &'static Arc<str> {
    static LINE: OnceLock<Arc<str>> = OnceLock::new();
    LINE.get_or_init(|| command_label(std::env::args_os()).into())
}

/// A holder label for the command line `argv`: its words joined by spaces,
/// with every value that looks like a secret replaced by `***`, cut to
/// [`MAX_LABEL_LEN`] bytes. Every label distlock derives from a command line
/// goes through it (see the [module docs](super#what-a-label-derived-from-a-command-line-keeps)
/// for what it redacts and what it cannot recognise).
///
/// ```
/// use distlock::inspect::command_label;
///
/// let label = command_label([
///     "pg_dump",
///     "--dbname=postgres://backup:hunter2@db1/app?sslpassword=k3y",
///     "--password",
///     "hunter2",
///     "PGPASSWORD=hunter2",
///     "--key",
///     "nightly",
/// ]);
/// assert_eq!(
///     label,
///     "pg_dump --dbname=postgres://backup:***@db1/app?sslpassword=*** --password *** \
///      PGPASSWORD=*** --key nightly"
/// );
/// ```
pub fn command_label<S: AsRef<std::ffi::OsStr>>(argv: impl IntoIterator<Item = S>) -> String {
    let words: Vec<String> = argv
        .into_iter()
        .map(|arg| arg.as_ref().to_string_lossy().into_owned())
        .collect();
    // Word by word over the joined line, so that a script passed as one
    // argument (`sh -c '... --password=x'`) is read as the command line it is.
    let line = words.join(" ");
    let mut label = String::with_capacity(line.len());
    let mut value_follows = false;
    for piece in line.split_inclusive(char::is_whitespace) {
        let word = piece.trim_end_matches(char::is_whitespace);
        let (redacted, next_is_value) = redact_word(word, value_follows);
        label.push_str(&redacted);
        label.push_str(&piece[word.len()..]);
        value_follows = next_is_value;
    }
    truncate(label)
}

/// What replaces a secret in a label.
const REDACTED: &str = "***";

/// One whitespace-free word of a command line, redacted, and whether the
/// word after it is a secret option's value (`--password hunter2`).
/// `is_value` says this word is one.
fn redact_word(word: &str, is_value: bool) -> (String, bool) {
    // Quotes and brackets around a word of a script (`'--token=x'`) are kept
    // but not read as part of it.
    const AROUND: &[char] = &['\'', '"', '`', '(', ')', ';'];
    let body = word.trim_start_matches(AROUND);
    let before = &word[..word.len() - body.len()];
    let body = body.trim_end_matches(AROUND);
    let after = &word[before.len() + body.len()..];
    if body.is_empty() {
        return (word.to_owned(), is_value);
    }
    let redacted = |inner: &str| format!("{before}{inner}{after}");
    if is_value && !body.starts_with('-') {
        return (redacted(REDACTED), false);
    }
    let dashes = body.len() - body.trim_start_matches('-').len();
    if dashes > 0 {
        // An option: `--name=value` or `--name` (its value may follow).
        return match body.split_once('=') {
            Some((name, _)) if is_secret_name(name) => {
                (redacted(&format!("{name}={REDACTED}")), false)
            }
            Some((name, value)) => (redacted(&format!("{name}={}", redact_urls(value))), false),
            None => (redacted(&redact_urls(body)), is_secret_name(body)),
        };
    }
    // `NAME=value`: an environment assignment (`env PGPASSWORD=x cmd`) or a
    // libpq keyword (`"host=db password=x"`).
    if let Some((name, value)) = body.split_once('=') {
        let is_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if is_name {
            let value = match is_secret_name(name) {
                true => REDACTED.to_owned(),
                false => redact_urls(value),
            };
            return (redacted(&format!("{name}={value}")), false);
        }
    }
    (redacted(&redact_urls(body)), false)
}

/// Whether an option or variable named `name` carries a secret: its name
/// contains `pass`, `pwd`, `secret`, `token`, `auth`, `credential`,
/// `cookie` or `private`, or ends a longer word with `key` (`--api-key`,
/// `AWS_SECRET_ACCESS_KEY`), but not `key` alone or first: `--key` names a
/// lock in distlock and a key file or id in most tools, `--keys` a count.
fn is_secret_name(name: &str) -> bool {
    let name = name.trim_start_matches('-').to_ascii_lowercase();
    const SECRET: [&str; 8] = [
        "pass",
        "pwd",
        "secret",
        "token",
        "auth",
        "credential",
        "cookie",
        "private",
    ];
    SECRET.iter().any(|part| name.contains(part)) || name.match_indices("key").any(|(at, _)| at > 0)
}

/// `text` with the password of every URL in it (`scheme://user:PASSWORD@`)
/// and the value of every secret-named query parameter (`?password=`,
/// `&token=`) replaced by `***`. The user name stays: it says who
/// connected, and a URL without a password is not redacted.
fn redact_urls(text: &str) -> String {
    if !text.contains("://") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | ',') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at_sign) => {
                let userinfo = &authority[..at_sign];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(REDACTED);
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at_sign..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
        let next = rest.find("://").map_or(rest.len(), |at| {
            // The next URL's scheme starts after the last separator before it.
            rest[..at]
                .rfind(|c: char| matches!(c, ',' | '=' | '?' | '&') || c.is_whitespace())
                .map_or(0, |sep| sep + 1)
        });
        out.push_str(&redact_query(&rest[..next]));
        rest = &rest[next..];
    }
    out.push_str(&redact_query(rest));
    out
}

/// A URL's path and query with the values of secret-named parameters
/// replaced by `***`.
fn redact_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (index, piece) in text.split_inclusive(['?', '&']).enumerate() {
        let separator = piece.len() - piece.trim_end_matches(['?', '&']).len();
        let (param, end) = piece.split_at(piece.len() - separator);
        match param.split_once('=') {
            // The first piece is the path, before any `?`.
            Some((name, value)) if index > 0 && is_secret_name(name) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
                // A fragment, or the next URL of a list, is not the value.
                let value_end = value.find([',', '#']).unwrap_or(value.len());
                out.push_str(&value[value_end..]);
            }
            _ => out.push_str(param),
        }
        out.push_str(end);
    }
    out
}

/// `label` cut to [`MAX_LABEL_LEN`] bytes, at a character boundary.
pub(super) fn truncate(mut label: String) -> String {
    if label.len() > MAX_LABEL_LEN {
        let mut end = MAX_LABEL_LEN;
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        label.truncate(end);
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn labels_are_cut_at_a_character_boundary() {
        let label = "é".repeat(MAX_LABEL_LEN);
        let cut = truncate(label);
        assert!(cut.len() <= MAX_LABEL_LEN && cut.len() > MAX_LABEL_LEN - 2);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn command_labels_keep_the_command_and_redact_secret_looking_values() {
        for (argv, label) in [
            // The issue's case: the script is read word by word too.
            (
                &["sh", "-c", "sleep 3", "dump-job", "--password=hunter2"][..],
                "sh -c sleep 3 dump-job --password=***",
            ),
            (
                &["distlock", "release", "--url", "postgres://ops:hunter2@db:5432/app", "--key", "K", "--force"],
                "distlock release --url postgres://ops:***@db:5432/app --key K --force",
            ),
            (&["redis-cli", "-u", "redis://:hunter2@r1:6379/0"], "redis-cli -u redis://:***@r1:6379/0"),
            (
                &["job", "--api-key", "hunter2", "--token", "hunter2", "--verbose", "x"],
                "job --api-key *** --token *** --verbose x",
            ),
            // A flag without a value does not swallow the next option.
            (&["psql", "--no-password", "-c", "select 1"], "psql --no-password -c select 1"),
            (
                &["env", "PGPASSWORD=hunter2", "AWS_SECRET_ACCESS_KEY=hunter2", "TZ=UTC", "pg_dump"],
                "env PGPASSWORD=*** AWS_SECRET_ACCESS_KEY=*** TZ=UTC pg_dump",
            ),
            (
                &["sh", "-c", "psql 'host=db password=hunter2' && curl \"--oauth2-bearer=hunter2\""],
                "sh -c psql 'host=db password=***' && curl \"--oauth2-bearer=***\"",
            ),
            (
                &["app", "--db=mysql://u:hunter2@h/d?ssl-mode=REQUIRED&password=hunter2,redis://:hunter2@h2"],
                "app --db=mysql://u:***@h/d?ssl-mode=REQUIRED&password=***,redis://:***@h2",
            ),
            // Nothing secret-looking: kept word for word.
            (
                &["distlock", "bench", "--keys", "100000", "--key", "jobs/a=b", "https://example.com/x?a=1"],
                "distlock bench --keys 100000 --key jobs/a=b https://example.com/x?a=1",
            ),
            (&["curl", "https://token-user@example.com/"], "curl https://token-user@example.com/"),
        ] {
            assert_eq!(command_label(argv), label, "{argv:?}");
        }
    }

    proptest! {
        #[test]
        fn no_password_of_a_url_or_secret_option_survives(
            secret in "[a-zA-Z0-9!%^*+]{6,20}",
            user in "[a-z]{1,8}",
            before in proptest::collection::vec("[a-z0-9/._-]{1,10}", 0..4),
        ) {
            let url = format!("postgres://{user}:{secret}@db/app?password={secret}");
            let mut argv = before.clone();
            argv.extend([url, format!("--password={secret}"), "--secret".into(), secret.clone()]);
            argv.push(format!("sh -c 'PGPASSWORD={secret} psql'"));
            let label = command_label(&argv);
            prop_assert!(!label.contains(&secret), "{label}");
            prop_assert!(label.starts_with(&before.join(" ")), "{label}");
        }
    }
}
