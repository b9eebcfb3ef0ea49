//! JSON and YAML read through a backend's field table: a mapping of
//! scalar settings, each handed over as text to the same `set(key, value)`
//! that URL parameters and variables reach.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// One setting as written in JSON or YAML.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Text(String),
    /// `null` (or `~`): the field left at its default.
    Unset(()),
}

/// The settings of a JSON object or YAML mapping, as `(field name, text)`
/// in the order of their names; `null` fields are left out.
///
/// # Errors
///
/// The format's error if the text is not a mapping of scalars (a nested
/// list or map names its field).
fn read_settings<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<(String, String)>, D::Error> {
    let map = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(map
        .into_iter()
        .filter_map(|(name, value)| {
            let text = match value {
                Scalar::Bool(value) => value.to_string(),
                Scalar::Unsigned(value) => value.to_string(),
                Scalar::Signed(value) => value.to_string(),
                Scalar::Float(value) => value.to_string(),
                Scalar::Text(text) => text,
                Scalar::Unset(()) => return None,
            };
            Some((name, text))
        })
        .collect())
}

/// The settings of a JSON object or YAML mapping as [`read_settings`]
/// gives them, for `serde_json::from_str` and `serde_yaml_ng::from_str`
/// (which also refuse trailing text).
pub(crate) struct Settings(pub(crate) Vec<(String, String)>);

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        read_settings(d).map(Settings)
    }
}

/// The settings of a YAML mapping, each scalar as written (`~` or `null`
/// left out): YAML's own typing would read an unquoted `password: 0123` as
/// the number 123, and [`Password`](super::Password) promises the text
/// written. (serde_yaml_ng hands a plain scalar to a string verbatim.)
pub(crate) struct YamlSettings(pub(crate) Vec<(String, String)>);

impl<'de> Deserialize<'de> for YamlSettings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map = BTreeMap::<String, Option<String>>::deserialize(d)?;
        let set = map
            .into_iter()
            .filter_map(|(name, text)| Some((name, text?)));
        Ok(YamlSettings(set.collect()))
    }
}

/// `queryTimeout` as `query_timeout`: JSON and YAML fields may be written
/// in camelCase or snake_case, as the Redis and etcd configs accept.
pub(crate) fn camel_to_snake(name: &str) -> String {
    let mut snake = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            snake.push('_');
            snake.push(c.to_ascii_lowercase());
        } else {
            snake.push(c);
        }
    }
    snake
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use super::*;

    #[test]
    fn json_scalars_become_text_and_names_snake_case() {
        let mut d = serde_json::Deserializer::from_str(
            r#"{"queryTimeout": 5, "holder": false, "keyPrefix": "a:", "x": null}"#,
        );
        let settings = read_settings(&mut d).unwrap();
        let named: Vec<(String, String)> = settings
            .into_iter()
            .map(|(name, text)| (camel_to_snake(&name), text))
            .collect();
        assert_eq!(
            named,
            [
                ("holder".to_owned(), "false".to_owned()),
                ("key_prefix".to_owned(), "a:".to_owned()),
                ("query_timeout".to_owned(), "5".to_owned()),
            ]
        );
    }

    #[test]
    fn yaml_scalars_stay_as_written() {
        let settings: YamlSettings =
            serde_yaml_ng::from_str("password: 0123\nholder: off\nqueryTimeout: 5\nx: ~\n")
                .unwrap();
        assert_eq!(
            settings.0,
            [
                ("holder".to_owned(), "off".to_owned()),
                ("password".to_owned(), "0123".to_owned()),
                ("queryTimeout".to_owned(), "5".to_owned()),
            ]
        );
    }
}
