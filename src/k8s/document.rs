//! One JSON or YAML document into a value: the syntax every object file shares, read by
//! [`super::read`] and parsed by [`super::node`], [`super::cluster_policy`] and
//! [`super::gpu_cluster`].

/// JSON when the text starts with `{`, YAML otherwise; the error is the parser's message.
pub fn json_or_yaml(text: &str) -> Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_norway::from_str(text).map_err(|e| e.to_string())
    }
}

/// What a `kubectl get KIND -o yaml|json` document holds: one object, or the items of a List.
pub enum OneOrList<'v> {
    One(&'v serde_json::Value),
    List(&'v [serde_json::Value]),
}

/// The object of `kind` in `api_version`, or the items of a `List` (or `<kind>List`) that are
/// all of `kind` (an item without `kind` counts as one); else what was found instead, in words.
pub fn one_or_list<'v>(
    value: &'v serde_json::Value,
    kind: &str,
    api_version: &str,
) -> Result<OneOrList<'v>, String> {
    use serde_json::Value;
    let found = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if found == kind && version == api_version {
        return Ok(OneOrList::One(value));
    }
    if found == "List" || found.strip_suffix("List") == Some(kind) {
        let items = value
            .get("items")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("a {found} without items"))?;
        if let Some(other) = items
            .iter()
            .filter_map(|i| i.get("kind").and_then(Value::as_str))
            .find(|k| *k != kind)
        {
            return Err(format!("a {found} holding a {other}"));
        }
        return Ok(OneOrList::List(items));
    }
    if found.is_empty() {
        return Err("an object without `kind`".to_owned());
    }
    Err(format!("{version} {found}"))
}
