//! A JSON object read with only the fields a caller names: everything else is skipped as it is
//! read, so a large object costs the fields kept, not a tree of all of it. The GPU-policy
//! objects are read this way wherever they come from: a review's request, the watch
//! ([`super::policy_object`]).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// What to do with the field at a path of keys.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Skipped.
    No,
    /// An object whose fields are chosen one by one. Anything else there is kept as a scalar, or
    /// an empty array for an array, so that a reader expecting an object says what it found.
    Fields,
    /// Kept as it is when it is a scalar; an object or array there is kept empty (the reader
    /// sees its type, not its contents).
    Value,
    /// Kept whole, whatever it is (a list of objects the reader reads item by item). The
    /// request's size limit bounds it.
    Whole,
}

/// Reads an object with the fields `keep` chooses; `null` is None, and a scalar or an array (an
/// empty one) is what it is.
pub fn read<'de, D: Deserializer<'de>>(
    deserializer: D,
    keep: fn(&[String]) -> Keep,
) -> Result<Option<Value>, D::Error> {
    let mut path = Vec::new();
    Fields {
        path: &mut path,
        keep,
    }
    .deserialize(deserializer)
}

struct Fields<'p> {
    path: &'p mut Vec<String>,
    keep: fn(&[String]) -> Keep,
}

impl<'de> DeserializeSeed<'de> for Fields<'_> {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.path.push(key);
            let kept = match (self.keep)(self.path) {
                Keep::No => {
                    map.next_value::<IgnoredAny>()?;
                    None
                }
                Keep::Fields => map.next_value_seed(Fields {
                    path: &mut *self.path,
                    keep: self.keep,
                })?,
                Keep::Value => Some(map.next_value_seed(Leaf)?),
                Keep::Whole => Some(map.next_value::<Value>()?),
            };
            let key = self.path.pop().unwrap_or_default();
            if let Some(value) = kept {
                // A repeated key: the last one wins, as serde_json's own map does.
                out.insert(key, value);
            }
        }
        Ok(Some(Value::Object(out)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Value>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Some(Value::Array(Vec::new())))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Option<Value>, E> {
        Ok(Some(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Option<Value>, E> {
        Ok(Some(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Option<Value>, E> {
        Ok(Some(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Option<Value>, E> {
        Ok(Some(Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<Value>, E> {
        Ok(Some(Value::String(v.to_owned())))
    }
    fn visit_unit<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }
}

/// A field kept whole when it is a scalar.
struct Leaf;

impl<'de> DeserializeSeed<'de> for Leaf {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Leaf {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Object(Map::new()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Array(Vec::new()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(path: &[String]) -> Keep {
        match path {
            [a] if a == "spec" || a == "metadata" => Keep::Fields,
            [a, b] if a == "metadata" && b == "name" => Keep::Value,
            [a, _] if a == "spec" => Keep::Fields,
            [a, _, c] if a == "spec" && c == "enabled" => Keep::Value,
            _ => Keep::No,
        }
    }

    fn pruned(text: &str) -> Option<Value> {
        let mut de = serde_json::Deserializer::from_str(text);
        read(&mut de, keep).unwrap()
    }

    #[test]
    fn only_the_named_fields_are_kept() {
        let v = pruned(
            r#"{"apiVersion":"nvidia.com/v1","metadata":{"name":"cp","labels":{"a":"b"}},
                "spec":{"toolkit":{"enabled":false,"version":"x"},"big":[1,2,3],"n":7,
                        "driver":{"enabled":{"deep":[1]}}},"status":{"state":"ready"}}"#,
        )
        .unwrap();
        // A scalar where fields were expected is kept, an array kept empty, so that a reader
        // says what it found; an object where a value was expected is kept empty.
        assert_eq!(
            v,
            serde_json::json!({"metadata": {"name": "cp"},
                "spec": {"toolkit": {"enabled": false}, "big": [], "n": 7,
                         "driver": {"enabled": {}}}})
        );
        assert_eq!(pruned("null"), None);
        assert_eq!(pruned("[1]"), Some(serde_json::json!([])));
    }

    #[test]
    fn a_repeated_key_keeps_the_last_value() {
        let v = pruned(r#"{"spec":{"toolkit":{"enabled":true,"enabled":false}}}"#).unwrap();
        assert_eq!(
            v.pointer("/spec/toolkit/enabled"),
            Some(&Value::Bool(false))
        );
    }
}
