//! Dedup keys: which bytes of a message decide that two copies are the same.
//!
//! A route's `key` is one of:
//! - `"topic+payload"` (the default): `blake3(topic ‖ 0x00 ‖ payload)`;
//! - `"payload"`: `blake3(payload)`, for feeds that publish one message on
//!   several topics;
//! - `{ json = ["/VP/veh", "/VP/oper", "/VP/tst"], topic = false, missing = "bytes" }`:
//!   the canonical values of JSON fields (RFC 6901 pointers), for copies whose
//!   bytes differ (a gateway that re-serialises the JSON, reorders fields,
//!   changes whitespace or number format, or adds a field of its own).
//!
//! **The canonical form of a field key, version 1.** It is part of the
//! contract (keys must stay the same across versions, or a rolling upgrade
//! would let duplicates through), pinned by the test vectors below:
//!
//! ```text
//! blake3( "firstseen-json-key-v1" 0x00
//!         [ topic 0x00 ]                       when `topic = true`
//!         for each pointer, in order: pointer 0x00 canonical(value) 0x00 )
//! ```
//!
//! `canonical` writes JSON without whitespace: `null`, `true`, `false`;
//! strings as serde_json writes them (escapes for `"`, `\` and control
//! characters only); arrays in order; objects with their keys sorted by
//! their UTF-8 bytes; numbers as integers when they are integral (`1`,
//! `1.0`, `1e0` and `100e-2` are all `1`), otherwise in Rust's shortest
//! round-trip form of the f64 (`0.5`, `1.25`).

use firstseen_store::{Key, KeyKind};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The byte keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum ByteKey {
    /// `blake3(topic ‖ 0x00 ‖ payload)`: the same payload on two topics is two
    /// messages. The default.
    #[default]
    #[serde(rename = "topic+payload")]
    TopicPayload,
    /// `blake3(payload)`.
    #[serde(rename = "payload")]
    Payload,
}

/// What a message whose payload is not JSON, or lacks a key field, gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Missing {
    /// The `topic+payload` byte key: such a message is deduplicated by its
    /// bytes. Counted in `firstseen_key_fallbacks_total`.
    #[default]
    Bytes,
    /// Set aside in the dead-letter store (reason `key-field-missing`) and
    /// acked, like an oversized payload.
    DeadLetter,
}

/// A key made of JSON fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FieldKey {
    /// RFC 6901 JSON pointers (`/VP/veh`), in the order they are hashed.
    pub json: Vec<String>,
    /// Whether the MQTT topic is part of the key too.
    #[serde(default)]
    pub topic: bool,
    /// What a message without the fields gets.
    #[serde(default)]
    pub missing: Missing,
}

/// What a route's dedup key hashes. Set per route in the config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum KeySpec {
    Bytes(ByteKey),
    Fields(FieldKey),
}

impl Default for KeySpec {
    fn default() -> Self {
        KeySpec::Bytes(ByteKey::TopicPayload)
    }
}

impl KeySpec {
    pub const TOPIC_PAYLOAD: KeySpec = KeySpec::Bytes(ByteKey::TopicPayload);
    pub const PAYLOAD: KeySpec = KeySpec::Bytes(ByteKey::Payload);

    /// The kind of key this rule makes: from cluster level 2 the window
    /// holds a key in its kind's domain, so a key of one kind never stands
    /// for a key of another (`firstseen_store::window::identity`). A field
    /// key that falls back to the bytes is of kind `topic+payload`.
    pub fn kind(&self) -> KeyKind {
        match self {
            KeySpec::Bytes(ByteKey::TopicPayload) => KeyKind::TopicPayload,
            KeySpec::Bytes(ByteKey::Payload) => KeyKind::Payload,
            KeySpec::Fields(_) => KeyKind::Fields,
        }
    }

    /// Every problem with the spec, for `check-config`: (the key below
    /// `key`, what is wrong).
    pub fn problems(&self) -> Vec<(String, String)> {
        let KeySpec::Fields(f) = self else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if f.json.is_empty() {
            out.push((
                "json".into(),
                "name at least one field (an RFC 6901 pointer such as `/VP/veh`)".into(),
            ));
        }
        for (i, p) in f.json.iter().enumerate() {
            if let Err(why) = check_pointer(p) {
                out.push((
                    format!("json[{i}]"),
                    format!("`{p}` is not a JSON pointer: {why}"),
                ));
            }
        }
        out
    }
}

/// Whether `p` is an RFC 6901 pointer: empty (the whole document) or `/`
/// followed by reference tokens, with `~` only as `~0` or `~1`.
pub fn check_pointer(p: &str) -> Result<(), &'static str> {
    if p.is_empty() {
        return Ok(());
    }
    if !p.starts_with('/') {
        return Err("it must start with `/`");
    }
    let b = p.as_bytes();
    for (i, c) in b.iter().enumerate() {
        if *c == b'~' && !matches!(b.get(i + 1), Some(b'0') | Some(b'1')) {
            return Err("`~` must be followed by 0 or 1");
        }
    }
    Ok(())
}

// The key is a string ("topic+payload", "payload") or a table; a table's
// own errors (an unknown field, a wrong type) keep their names.
impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeySpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#""topic+payload", "payload", or a table like { json = ["/VP/veh"] }"#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeySpec, E> {
                match s {
                    "topic+payload" => Ok(KeySpec::TOPIC_PAYLOAD),
                    "payload" => Ok(KeySpec::PAYLOAD),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<M: MapAccess<'de>>(self, m: M) -> Result<KeySpec, M::Error> {
                FieldKey::deserialize(de::value::MapAccessDeserializer::new(m)).map(KeySpec::Fields)
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a field key could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the payload is not JSON: {0}")]
    NotJson(String),
    #[error("the payload has no field `{0}`")]
    NoField(String),
}

/// The byte key of one message. The 0x00 separator cannot occur in an MQTT
/// topic (the spec forbids U+0000), so no topic/payload split of the same
/// bytes can collide with another.
pub fn byte_key(spec: ByteKey, topic: &str, payload: &[u8]) -> Key {
    let mut h = blake3::Hasher::new();
    if spec == ByteKey::TopicPayload {
        h.update(topic.as_bytes());
        h.update(&[0]);
    }
    h.update(payload);
    *h.finalize().as_bytes()
}

/// The field key of one message (see the module docs for its form).
pub fn field_key(spec: &FieldKey, topic: &str, payload: &[u8]) -> Result<Key, KeyError> {
    let doc: Value =
        serde_json::from_slice(payload).map_err(|e| KeyError::NotJson(e.to_string()))?;
    let mut h = blake3::Hasher::new();
    h.update(b"firstseen-json-key-v1\0");
    if spec.topic {
        h.update(topic.as_bytes());
        h.update(&[0]);
    }
    let mut buf = Vec::with_capacity(64);
    for p in &spec.json {
        let v = doc.pointer(p).ok_or_else(|| KeyError::NoField(p.clone()))?;
        buf.clear();
        canonical(v, &mut buf);
        h.update(p.as_bytes());
        h.update(&[0]);
        h.update(&buf);
        h.update(&[0]);
    }
    Ok(*h.finalize().as_bytes())
}

/// A message's key under `spec`.
pub fn key(spec: &KeySpec, topic: &str, payload: &[u8]) -> Result<Key, KeyError> {
    match spec {
        KeySpec::Bytes(b) => Ok(byte_key(*b, topic, payload)),
        KeySpec::Fields(f) => field_key(f, topic, payload),
    }
}

/// The key ingest gives a message under `spec`: its [`key`], or when a
/// field key cannot be made and the rule says `missing = "bytes"`, the
/// `topic+payload` key. `None` when the rule sets such a message aside
/// (it never reaches Pulsar).
pub fn published_key(spec: &KeySpec, topic: &str, payload: &[u8]) -> Option<Key> {
    match key(spec, topic, payload) {
        Ok(k) => Some(k),
        Err(_) => match spec {
            KeySpec::Fields(f) if f.missing == Missing::DeadLetter => None,
            _ => Some(byte_key(ByteKey::TopicPayload, topic, payload)),
        },
    }
}

/// Writes `v` in the canonical form of the module docs.
pub fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                // Integral floats within the range where every integer is
                // exact are written as integers: 1.0 and 1 are one value.
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                    out.extend_from_slice((f as i64).to_string().as_bytes());
                } else {
                    out.extend_from_slice(f.to_string().as_bytes());
                }
            }
        }
        Value::String(s) => {
            out.extend_from_slice(serde_json::to_string(s).unwrap_or_default().as_bytes())
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(serde_json::to_string(k).unwrap_or_default().as_bytes());
                out.push(b':');
                canonical(&map[*k], out);
            }
            out.push(b'}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_key_is_blake3_of_topic_nul_payload() {
        let expect = blake3::hash(b"a/b\0{\"x\":1}");
        assert_eq!(
            key(&KeySpec::TOPIC_PAYLOAD, "a/b", b"{\"x\":1}").unwrap(),
            *expect.as_bytes()
        );
    }

    #[test]
    fn the_separator_keeps_topic_and_payload_apart() {
        assert_ne!(
            byte_key(ByteKey::TopicPayload, "ab", b"c"),
            byte_key(ByteKey::TopicPayload, "a", b"bc")
        );
    }

    #[test]
    fn payload_keys_ignore_the_topic() {
        assert_eq!(
            byte_key(ByteKey::Payload, "a", b"p"),
            byte_key(ByteKey::Payload, "b", b"p")
        );
        assert_eq!(
            byte_key(ByteKey::Payload, "a", b""),
            *blake3::hash(b"").as_bytes()
        );
    }

    fn hsl() -> FieldKey {
        FieldKey {
            json: vec!["/VP/veh".into(), "/VP/oper".into(), "/VP/tst".into()],
            topic: false,
            missing: Missing::Bytes,
        }
    }

    /// Found by the `json_key` fuzz target: a number longer than an f64
    /// holds was parsed one way as written and another way as serde_json
    /// prints it back, so the two spellings gave two keys.
    #[test]
    fn a_long_number_keys_the_same_however_it_is_spelled() {
        let spec = FieldKey {
            json: vec!["/VP/tsi".into()],
            topic: false,
            missing: Missing::default(),
        };
        let long = br#"{"VP":{"tsi":153905957257777777777777777777777777777777.081113}}"#;
        let doc: Value = serde_json::from_slice(long).unwrap();
        let printed = serde_json::to_vec(&doc).unwrap();
        assert_eq!(
            field_key(&spec, "t", long).unwrap(),
            field_key(&spec, "t", &printed).unwrap(),
            "{}",
            String::from_utf8_lossy(&printed)
        );
    }

    #[test]
    fn field_order_whitespace_and_number_format_do_not_change_the_key() {
        let a = br#"{"VP":{"desi":"550","oper":22,"veh":1234,"tst":"2020-08-21T07:44:51.000Z","lat":60.2}}"#;
        let b = br#"{ "VP" : { "lat" : 6.02e1, "tst":"2020-08-21T07:44:51.000Z",
                     "veh": 1234.0, "oper" : 22 , "desi":"550", "hop": "gateway-b" } }"#;
        let k = hsl();
        assert_eq!(
            field_key(&k, "t", a).unwrap(),
            field_key(&k, "t", b).unwrap()
        );
        // Another vehicle is another message.
        let c = br#"{"VP":{"oper":22,"veh":1235,"tst":"2020-08-21T07:44:51.000Z"}}"#;
        assert_ne!(
            field_key(&k, "t", a).unwrap(),
            field_key(&k, "t", c).unwrap()
        );
        // The topic counts only when asked for.
        assert_eq!(
            field_key(&k, "t", a).unwrap(),
            field_key(&k, "u", a).unwrap()
        );
        let with_topic = FieldKey {
            topic: true,
            ..hsl()
        };
        assert_ne!(
            field_key(&with_topic, "t", a).unwrap(),
            field_key(&with_topic, "u", a).unwrap()
        );
    }

    /// Pinned digests, computed outside this code (Python `blake3` over the
    /// byte string of the module docs). If one of these changes, keys change across versions
    /// and a rolling upgrade lets duplicates through. Do not update them;
    /// add a `v2` form instead.
    #[test]
    fn the_canonical_form_is_pinned() {
        let mut out = Vec::new();
        canonical(
            &serde_json::from_str(
                r#"{"b":[1.0,2.5,"x\"y"],"a":null,"é":true,"c":{"z":1e2,"y":-0.25}}"#,
            )
            .unwrap(),
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":null,"b":[1,2.5,"x\"y"],"c":{"y":-0.25,"z":100},"é":true}"#
        );
        let a = br#"{"VP":{"oper":22,"veh":1234,"tst":"2020-08-21T07:44:51.000Z"}}"#;
        assert_eq!(
            hex::encode(field_key(&hsl(), "t", a).unwrap()),
            "5c8a54839fbe3d6f204af3216a475b904dd6b3df41da8cdc234ab9428d340d96"
        );
        let with_topic = FieldKey {
            topic: true,
            ..hsl()
        };
        assert_eq!(
            hex::encode(field_key(&with_topic, "/hfp/v2/x", a).unwrap()),
            "3ce38d3ea79d05ed603863c0f5fdb02115680d5a6b012aeef3d8c3bc7d67b961"
        );
    }

    #[test]
    fn a_missing_field_or_a_payload_that_is_not_json_is_told_apart() {
        let k = hsl();
        assert_eq!(
            field_key(&k, "t", br#"{"VP":{"veh":1,"oper":2}}"#),
            Err(KeyError::NoField("/VP/tst".into()))
        );
        assert!(matches!(
            field_key(&k, "t", b"\x00not json"),
            Err(KeyError::NotJson(_))
        ));
    }

    #[test]
    fn specs_parse_from_a_string_or_a_table_and_name_their_problems() {
        #[derive(Deserialize)]
        struct R {
            key: KeySpec,
        }
        let r: R = toml::from_str(r#"key = "payload""#).unwrap();
        assert_eq!(r.key, KeySpec::PAYLOAD);
        let r: R =
            toml::from_str(r#"key = { json = ["/VP/veh"], missing = "dead-letter" }"#).unwrap();
        assert_eq!(
            r.key,
            KeySpec::Fields(FieldKey {
                json: vec!["/VP/veh".into()],
                topic: false,
                missing: Missing::DeadLetter
            })
        );
        assert!(toml::from_str::<R>(r#"key = "bytes""#).is_err());
        assert!(toml::from_str::<R>(r#"key = { json = ["/a"], colour = 1 }"#).is_err());
        let bad = KeySpec::Fields(FieldKey {
            json: vec!["VP/veh".into(), "/a~2".into()],
            topic: false,
            missing: Missing::Bytes,
        });
        let p = bad.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!((p[0].0.as_str(), p[1].0.as_str()), ("json[0]", "json[1]"));
    }
}
