//! docs/configuration.md, deploy/reference.toml and the config structs
//! must name exactly the same keys.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Dotted key paths of a TOML value; array elements become `[]`.
fn keys(value: &toml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                keys(v, &path, out);
            }
        }
        toml::Value::Array(items) if items.iter().all(|i| i.is_table()) && !items.is_empty() => {
            for item in items {
                keys(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

#[test]
fn reference_docs_and_code_name_the_same_keys() {
    let text = std::fs::read_to_string(repo().join("deploy/reference.toml")).unwrap();
    // Strict deserialisation (unknown keys and wrong types are errors) but
    // no semantic checks: the file shows both keys of exclusive pairs.
    let config: firstseen::config::Config =
        toml::from_str(&text).unwrap_or_else(|e| panic!("reference.toml does not parse: {e}"));

    let mut in_file = BTreeSet::new();
    keys(
        &toml::Value::Table(text.parse::<toml::Table>().unwrap()),
        "",
        &mut in_file,
    );

    // Serialising the parsed config back lists every field the code has
    // (all optional fields are set in reference.toml, so none is skipped).
    let mut in_code = BTreeSet::new();
    keys(&toml::Value::try_from(&config).unwrap(), "", &mut in_code);
    assert_eq!(
        in_file, in_code,
        "reference.toml does not set exactly the fields the code has"
    );

    let doc = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let in_doc: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    assert_eq!(
        in_doc, in_code,
        "docs/configuration.md does not document exactly the config keys"
    );
}
