//! `FIRSTSEEN__A__B=value` environment overrides applied onto parsed TOML.

use super::Problem;

const PREFIX: &str = "FIRSTSEEN__";

/// Applies every `FIRSTSEEN__…` variable to `root`. Unknown keys are not
/// checked here: the typed parse that follows refuses them by name.
pub fn apply_overrides(
    root: &mut toml::Value,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<(), Problem> {
    let mut overrides: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .collect();
    // Sorted, so that the result never depends on the environment's order.
    overrides.sort();
    for (name, raw) in overrides {
        let path: Vec<String> = name[PREFIX.len()..]
            .split("__")
            .map(|s| s.to_ascii_lowercase())
            .collect();
        set(root, &path, scalar(&raw)).map_err(|e| Problem {
            key: format!("${name}"),
            message: e.to_string(),
        })?;
    }
    Ok(())
}

/// Reads an override as a TOML scalar if it is one, else as a string.
fn scalar(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => match t.remove("v") {
            Some(
                v @ (toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Float(_)),
            ) => v,
            _ => toml::Value::String(raw.to_string()),
        },
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

/// Why an override names no place in the config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum BadOverride {
    #[error("empty key")]
    EmptyKey,
    #[error("empty path segment")]
    EmptySegment,
    #[error("`{0}` is not an array index")]
    NotAnIndex(String),
    #[error("index {index} is past the {len} elements")]
    PastTheEnd { index: usize, len: usize },
    #[error("`{0}` is below a value that is not a table")]
    BelowAValue(String),
}

fn set(node: &mut toml::Value, path: &[String], value: toml::Value) -> Result<(), BadOverride> {
    let Some((head, rest)) = path.split_first() else {
        return Err(BadOverride::EmptyKey);
    };
    if head.is_empty() {
        return Err(BadOverride::EmptySegment);
    }
    let child = match node {
        toml::Value::Table(t) => {
            if rest.is_empty() {
                t.insert(head.clone(), value);
                return Ok(());
            }
            t.entry(head.clone())
                .or_insert_with(|| toml::Value::Table(Default::default()))
        }
        toml::Value::Array(a) => {
            let i: usize = head
                .parse()
                .map_err(|_| BadOverride::NotAnIndex(head.clone()))?;
            let len = a.len();
            let slot = a
                .get_mut(i)
                .ok_or(BadOverride::PastTheEnd { index: i, len })?;
            if rest.is_empty() {
                *slot = value;
                return Ok(());
            }
            slot
        }
        _ => return Err(BadOverride::BelowAValue(head.clone())),
    };
    set(child, rest, value)
}
