//! One JSON or YAML document into a value: the syntax every object file shares, read by
//! [`super::read`] and parsed by [`super::node`] and [`super::cluster_policy`].

/// JSON when the text starts with `{`, YAML otherwise; the error is the parser's message.
pub fn json_or_yaml(text: &str) -> Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_norway::from_str(text).map_err(|e| e.to_string())
    }
}
