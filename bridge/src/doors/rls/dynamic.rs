//! envoyproxy/ratelimit's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`, the bridge's
//! `--rls-dynamic-metadata`): what Envoy's `ratelimit` filter puts under its own name for
//! access logs and later filters to read. The call's `domain`, its `descriptors` (each
//! `entries` as `key=value`, its `limit` override, its `hitsAddend`), the request's
//! `hitsAddend`, and the `metadata` of every limit its descriptor passed, merged: the
//! shapes that service gives them, so what reads them keeps working.

use super::proto::{Kind, ListValue, RateLimitDescriptor, RateLimitRequest, Struct, Value};
use super::raw::unit_name;
use std::collections::BTreeMap;

/// The dynamic metadata of `request`, whose descriptors `passed` (by index) carry the
/// limits' `metadata`, merged in their order.
pub fn of(request: &RateLimitRequest, passed: &[&Struct]) -> Struct {
    let mut fields = BTreeMap::new();
    fields.insert("domain".into(), Value::string(request.domain.clone()));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    let list = ListValue {
        values: descriptors,
    };
    fields.insert("descriptors".into(), Value::of(Kind::List(list)));
    if request.hits_addend != 0 {
        let hits = Kind::Number(f64::from(request.hits_addend));
        fields.insert("hitsAddend".into(), Value::of(hits));
    }
    let mut metadata = Struct::default();
    for limit in passed {
        merge(&mut metadata, limit);
    }
    if !metadata.fields.is_empty() {
        fields.insert("metadata".into(), Value::of(Kind::Struct(metadata)));
    }
    Struct { fields }
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let entries = d.entries.iter().map(|e| {
        let entry = format!("{}={}", e.key, e.value);
        Value::string(entry)
    });
    let mut fields = BTreeMap::new();
    let list = ListValue {
        values: entries.collect(),
    };
    fields.insert("entries".into(), Value::of(Kind::List(list)));
    if let Some(limit) = &d.limit {
        // As Go prints the message: `requests_per_unit:10 unit:MINUTE`.
        let unit = unit_name(limit.unit).map_or_else(|| limit.unit.to_string(), str::to_uppercase);
        let text = format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit);
        fields.insert("limit".into(), Value::string(text));
    }
    if let Some(hits) = &d.hits_addend {
        // A JSON number, as theirs: exact up to 2^53.
        #[allow(clippy::cast_precision_loss)]
        let hits = Kind::Number(hits.value as f64);
        fields.insert("hitsAddend".into(), Value::of(hits));
    }
    Value::of(Kind::Struct(Struct { fields }))
}

/// `from` merged into `into` as envoyproxy/ratelimit merges: structs field by field, and
/// otherwise the first limit's value stays.
fn merge(into: &mut Struct, from: &Struct) {
    for (key, value) in &from.fields {
        match (into.fields.get_mut(key), &value.kind) {
            (None, _) => {
                into.fields.insert(key.clone(), value.clone());
            }
            (Some(there), Some(Kind::Struct(more))) => {
                if let Some(Kind::Struct(mine)) = &mut there.kind {
                    merge(mine, more);
                }
            }
            (Some(_), _) => {}
        }
    }
}
