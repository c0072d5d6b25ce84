//! The rule table is the one list of rules: the chart's values, its schema and the README's
//! table must name exactly the rules of `RULES`, with their default actions.

use std::collections::BTreeMap;
use std::path::Path;

use gpu_deploy_guard::core::rules::RULES;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn table() -> BTreeMap<String, String> {
    RULES
        .iter()
        .map(|s| (s.id.to_owned(), s.default.as_str().to_owned()))
        .collect()
}

#[test]
fn the_chart_values_list_every_rule_with_its_default() {
    let values: serde_json::Value =
        serde_norway::from_str(&read("deploy/helm/gpu-deploy-guard/values.yaml")).unwrap();
    let rules = values
        .pointer("/config/rules")
        .and_then(|r| r.as_object())
        .expect("config.rules in values.yaml");
    let got: BTreeMap<String, String> = rules
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    assert_eq!(got, table());
}

#[test]
fn the_values_schema_accepts_exactly_the_rules() {
    let schema: serde_json::Value =
        serde_json::from_str(&read("deploy/helm/gpu-deploy-guard/values.schema.json")).unwrap();
    let rules = schema
        .pointer("/properties/config/properties/rules")
        .expect("properties.config.properties.rules in values.schema.json");
    assert_eq!(rules["additionalProperties"], serde_json::json!(false));
    let got: Vec<&String> = rules["properties"].as_object().unwrap().keys().collect();
    let want: Vec<String> = table().into_keys().collect();
    let mut got: Vec<String> = got.into_iter().cloned().collect();
    got.sort();
    assert_eq!(got, want);
    for (id, spec) in rules["properties"].as_object().unwrap() {
        assert_eq!(
            spec["enum"],
            serde_json::json!(["deny", "warn", "audit", "off"]),
            "{id}"
        );
    }
}

#[test]
fn the_readme_table_lists_every_rule_with_its_default() {
    let readme = read("README.md");
    let got: BTreeMap<String, String> = readme
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            // | `rule-id` | default | fires when |
            let id = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            // Flag tables have `--flag` rows whose default may read `off`.
            if id.starts_with('-') {
                return None;
            }
            let default = *cells.get(2)?;
            ["deny", "warn", "audit", "off"]
                .contains(&default)
                .then(|| (id.to_owned(), default.to_owned()))
        })
        .collect();
    assert_eq!(got, table());
}
