//! The item codec: the lease record as DynamoDB attributes and back, the
//! description of a malformed item, and conditions as condition expressions.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::{KEY, TTL_ATTRIBUTE};
use crate::lease::{
    Condition, FORMAT, FORMAT_SESSIONS, FORMAT_SLOTS, HolderMeta, Lease, Malformed, Record,
    RvnGuard, StoreError, UnknownFormat, known_format,
};
use crate::text;

// ---------------------------------------------------------------------------
// Items: the lease record <-> DynamoDB attributes.

pub(super) fn lease_item(lease: &Lease) -> HashMap<String, AttributeValue> {
    let n = |v: u64| AttributeValue::N(v.to_string());
    let mut item = HashMap::from([
        (KEY.to_owned(), AttributeValue::S(lease.election.clone())),
        ("rvn".to_owned(), AttributeValue::S(lease.rvn.clone())),
        ("fencing_token".to_owned(), n(lease.fencing_token)),
        ("lease_ms".to_owned(), n(lease.stored_lease_ms())),
        ("acquired_at".to_owned(), n(lease.acquired_at_ms)),
        ("renewed_at".to_owned(), n(lease.renewed_at_ms)),
        (TTL_ATTRIBUTE.to_owned(), n(lease.expires_at_s)),
        (FORMAT_ATTRIBUTE.to_owned(), n(lease.format())),
    ]);
    if let Some(session) = &lease.session {
        item.insert("session".to_owned(), AttributeValue::S(session.clone()));
    }
    // A released lease carries neither holder nor holder metadata.
    if let Some(holder) = &lease.holder {
        item.insert("holder".to_owned(), AttributeValue::S(holder.clone()));
        if let Some(meta) = &lease.holder_meta {
            let mut m = HashMap::new();
            if let Some(address) = &meta.address {
                m.insert("address".to_owned(), AttributeValue::S(address.clone()));
            }
            let labels = meta
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), AttributeValue::S(v.clone())))
                .collect();
            m.insert("labels".to_owned(), AttributeValue::M(labels));
            if let Some(slots) = &meta.slots {
                m.insert("slots".to_owned(), AttributeValue::S(slots.clone()));
            }
            item.insert("holder_meta".to_owned(), AttributeValue::M(m));
        }
    }
    if let Some(successor) = &lease.successor {
        item.insert("successor".to_owned(), AttributeValue::S(successor.clone()));
    }
    item
}

/// The attribute that names the record's format (see [`FORMAT`]).
const FORMAT_ATTRIBUTE: &str = "format";

/// A read item as a record; never fails, never panics. The format comes
/// first: an item of another format is never judged by this one's layout.
pub(super) fn parse_item(election: &str, item: &HashMap<String, AttributeValue>) -> Record {
    let election = match item.get(KEY) {
        Some(AttributeValue::S(name)) => name.clone(),
        _ => election.to_owned(),
    };
    if let Some(format) = unknown_format(item.get(FORMAT_ATTRIBUTE)) {
        return Record::UnknownFormat(UnknownFormat {
            election,
            format,
            holder: match item.get("holder") {
                Some(AttributeValue::S(h)) => Some(h.clone()),
                _ => None,
            },
            fencing_token: item.get("fencing_token").and_then(|v| number(v).ok()),
            fingerprint: fingerprint(item),
        });
    }
    match parse_lease(item) {
        Ok(lease) => Record::Valid(lease),
        Err(problem) => Record::Malformed(Malformed {
            election,
            problem,
            fingerprint: fingerprint(item),
            fencing_token: item.get("fencing_token").and_then(|v| number(v).ok()),
            guard: match item.get("rvn") {
                None => RvnGuard::Missing,
                Some(raw) => RvnGuard::Raw(encode_value(raw)),
            },
        }),
    }
}

/// The stored `format`, as humans read it, unless it is absent or this
/// build's: a number as stored, a string quoted, another type in
/// DynamoDB's JSON form.
fn unknown_format(value: Option<&AttributeValue>) -> Option<String> {
    let shown = match value? {
        AttributeValue::N(n) if n.parse::<u64>().is_ok_and(known_format) => return None,
        AttributeValue::N(n) => n.clone(),
        AttributeValue::S(s) => format!("{s:?}"),
        other => encode_value(other),
    };
    Some(text::shorten(&shown, 40))
}

fn parse_lease(item: &HashMap<String, AttributeValue>) -> Result<Lease, String> {
    let required = |name: &str| {
        item.get(name)
            .ok_or_else(|| format!("attribute `{name}` is missing"))
    };
    let string = |name: &str| {
        required(name).and_then(|v| match v {
            AttributeValue::S(s) => Ok(s.clone()),
            other => Err(wrong_type(name, other, "S")),
        })
    };
    let num = |name: &str| {
        required(name).and_then(|v| number(v).map_err(|e| format!("attribute `{name}` {e}")))
    };
    let holder = match item.get("holder") {
        None => None,
        Some(AttributeValue::S(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("holder", other, "S")),
    };
    Ok(Lease {
        election: string(KEY)?,
        rvn: string("rvn")?,
        holder,
        fencing_token: num("fencing_token")?,
        lease_ms: num("lease_ms")?,
        acquired_at_ms: num("acquired_at")?,
        renewed_at_ms: num("renewed_at")?,
        expires_at_s: num(TTL_ATTRIBUTE)?,
        holder_meta: parse_meta(item.get("holder_meta"))?,
        successor: match item.get("successor") {
            None => None,
            Some(AttributeValue::S(s)) => Some(s.clone()),
            Some(other) => return Err(wrong_type("successor", other, "S")),
        },
        session: match item.get("session") {
            None => None,
            Some(AttributeValue::S(s)) => Some(s.clone()),
            Some(other) => return Err(wrong_type("session", other, "S")),
        },
    })
}

fn parse_meta(value: Option<&AttributeValue>) -> Result<Option<HolderMeta>, String> {
    let m = match value {
        None => return Ok(None),
        Some(AttributeValue::M(m)) => m,
        Some(other) => return Err(wrong_type("holder_meta", other, "M")),
    };
    let address = match m.get("address") {
        None => None,
        Some(AttributeValue::S(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("holder_meta.address", other, "S")),
    };
    let mut meta = HolderMeta {
        address,
        ..HolderMeta::default()
    };
    match m.get("labels") {
        None => {}
        Some(AttributeValue::M(labels)) => {
            for (k, v) in labels {
                match v {
                    AttributeValue::S(s) => {
                        meta.labels.insert(k.clone(), s.clone());
                    }
                    other => {
                        return Err(wrong_type(&format!("holder_meta.labels.{k}"), other, "S"));
                    }
                }
            }
        }
        Some(other) => return Err(wrong_type("holder_meta.labels", other, "M")),
    }
    meta.slots = match m.get("slots") {
        None => None,
        Some(AttributeValue::S(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("holder_meta.slots", other, "S")),
    };
    Ok(Some(meta))
}

/// An N attribute holding a non-negative integer.
fn number(v: &AttributeValue) -> Result<u64, String> {
    match v {
        AttributeValue::N(n) => n
            .parse::<u64>()
            .map_err(|_| format!("is not a non-negative integer: {n:?}")),
        other => Err(format!("is {}, expected N", type_name(other))),
    }
}

fn wrong_type(name: &str, v: &AttributeValue, expected: &str) -> String {
    format!(
        "attribute `{name}` is {}, expected {expected}",
        type_name(v)
    )
}

fn type_name(v: &AttributeValue) -> &'static str {
    match v {
        AttributeValue::S(_) => "S",
        AttributeValue::N(_) => "N",
        AttributeValue::B(_) => "B",
        AttributeValue::Ss(_) => "SS",
        AttributeValue::Ns(_) => "NS",
        AttributeValue::Bs(_) => "BS",
        AttributeValue::M(_) => "M",
        AttributeValue::L(_) => "L",
        AttributeValue::Null(_) => "NULL",
        AttributeValue::Bool(_) => "BOOL",
        _ => "an unknown type",
    }
}

/// A digest of the whole item that changes whenever any attribute does.
/// Compared only within one process, so a fixed-key SipHash suffices.
pub(super) fn fingerprint(item: &HashMap<String, AttributeValue>) -> String {
    let mut keys: Vec<&String> = item.keys().collect();
    keys.sort();
    let canonical: serde_json::Map<String, serde_json::Value> = keys
        .into_iter()
        .map(|k| (k.clone(), to_json(&item[k])))
        .collect();
    let mut h = std::hash::DefaultHasher::new();
    serde_json::Value::Object(canonical)
        .to_string()
        .hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Our encoding of a raw attribute value (DynamoDB's JSON form, sets sorted)
/// for `RvnGuard::Raw`; [`decode_value`] inverts it.
pub(super) fn encode_value(v: &AttributeValue) -> String {
    to_json(v).to_string()
}

pub(super) fn decode_value(s: &str) -> Option<AttributeValue> {
    from_json(&serde_json::from_str(s).ok()?)
}

fn to_json(v: &AttributeValue) -> serde_json::Value {
    use serde_json::{Value, json};
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::B(b) => json!({ "B": text::hex(b.as_ref()) }),
        AttributeValue::Ss(v) => json!({ "SS": sorted(v) }),
        AttributeValue::Ns(v) => json!({ "NS": sorted(v) }),
        AttributeValue::Bs(v) => {
            let mut v: Vec<String> = v.iter().map(|b| text::hex(b.as_ref())).collect();
            v.sort();
            json!({ "BS": v })
        }
        AttributeValue::M(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let map: serde_json::Map<String, Value> = keys
                .into_iter()
                .map(|k| (k.clone(), to_json(&m[k])))
                .collect();
            json!({ "M": map })
        }
        AttributeValue::L(l) => json!({ "L": l.iter().map(to_json).collect::<Vec<_>>() }),
        AttributeValue::Null(b) => json!({ "NULL": b }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        _ => json!({ "UNKNOWN": null }),
    }
}

fn from_json(v: &serde_json::Value) -> Option<AttributeValue> {
    let obj = v.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    let (ty, v) = obj.iter().next()?;
    let strings = |v: &serde_json::Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    Some(match ty.as_str() {
        "S" => AttributeValue::S(v.as_str()?.to_owned()),
        "N" => AttributeValue::N(v.as_str()?.to_owned()),
        "B" => AttributeValue::B(Blob::new(unhex(v.as_str()?)?)),
        "SS" => AttributeValue::Ss(strings(v)?),
        "NS" => AttributeValue::Ns(strings(v)?),
        "BS" => AttributeValue::Bs(
            strings(v)?
                .iter()
                .map(|s| unhex(s).map(Blob::new))
                .collect::<Option<_>>()?,
        ),
        "M" => AttributeValue::M(
            v.as_object()?
                .iter()
                .map(|(k, v)| Some((k.clone(), from_json(v)?)))
                .collect::<Option<_>>()?,
        ),
        "L" => AttributeValue::L(v.as_array()?.iter().map(from_json).collect::<Option<_>>()?),
        "NULL" => AttributeValue::Null(v.as_bool()?),
        "BOOL" => AttributeValue::Bool(v.as_bool()?),
        _ => return None,
    })
}

pub(super) use crate::text::unhex;

// ---------------------------------------------------------------------------
// Conditions: the rules of `Condition::holds` as condition expressions.

/// A condition expression with its names and values.
pub(super) struct ConditionExpression {
    pub(super) expression: &'static str,
    pub(super) names: HashMap<String, String>,
    /// `None` when empty: DynamoDB rejects an empty value map.
    pub(super) values: Option<HashMap<String, AttributeValue>>,
}

pub(super) fn condition_expression(
    condition: &Condition,
) -> Result<ConditionExpression, StoreError> {
    // Attribute names go through placeholders so that no name can collide
    // with a DynamoDB reserved word; unused placeholders are an error there.
    let names = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(p, n)| ((*p).to_owned(), (*n).to_owned()))
            .chain([("#f".to_owned(), FORMAT_ATTRIBUTE.to_owned())])
            .collect::<HashMap<_, _>>()
    };
    // Every write over an item requires it to be of a format this build
    // knows (`#f` absent, :f, :g or :c): what a later format means is not ours
    // to judge, whatever this process read before.
    let values = |list: Vec<(&str, AttributeValue)>| {
        list.into_iter()
            .map(|(p, v)| (p.to_owned(), v))
            .chain([
                (":f".to_owned(), AttributeValue::N(FORMAT.to_string())),
                (
                    ":g".to_owned(),
                    AttributeValue::N(FORMAT_SESSIONS.to_string()),
                ),
                (":c".to_owned(), AttributeValue::N(FORMAT_SLOTS.to_string())),
            ])
            .collect::<HashMap<_, _>>()
    };
    let s = |v: &str| AttributeValue::S(v.to_owned());
    Ok(match condition {
        Condition::NotExists => ConditionExpression {
            expression: "attribute_not_exists(#e)",
            names: HashMap::from([("#e".to_owned(), KEY.to_owned())]),
            values: None,
        },
        // The numeric attributes' types are part of the condition: an item
        // another tool corrupted is malformed, and only
        // `Unchanged` may overwrite it, as in every other store.
        Condition::RvnIs(rvn) => ConditionExpression {
            expression: "#r = :r AND attribute_type(#t, :n) AND attribute_type(#l, :n) \
                AND (attribute_not_exists(#f) OR #f = :f OR #f = :g OR #f = :c)",
            names: names(&[("#r", "rvn"), ("#t", "fencing_token"), ("#l", "lease_ms")]),
            values: Some(values(vec![(":r", s(rvn)), (":n", s("N"))])),
        },
        Condition::HeldBy { rvn, holder } => ConditionExpression {
            expression: "#r = :r AND #h = :h AND attribute_type(#t, :n) \
                AND attribute_type(#l, :n) AND (attribute_not_exists(#f) OR #f = :f OR #f = :g OR #f = :c)",
            names: names(&[
                ("#r", "rvn"),
                ("#h", "holder"),
                ("#t", "fencing_token"),
                ("#l", "lease_ms"),
            ]),
            values: Some(values(vec![
                (":r", s(rvn)),
                (":h", s(holder)),
                (":n", s("N")),
            ])),
        },
        Condition::Unchanged(RvnGuard::Raw(raw)) => {
            let value = decode_value(raw).ok_or_else(|| {
                StoreError::Other(format!(
                    "rvn guard {raw:?} was not produced by the DynamoDB store"
                ))
            })?;
            ConditionExpression {
                expression: "#r = :raw AND (attribute_not_exists(#f) OR #f = :f OR #f = :g OR #f = :c)",
                names: names(&[("#r", "rvn")]),
                values: Some(values(vec![(":raw", value)])),
            }
        }
        Condition::Unchanged(RvnGuard::Missing) => ConditionExpression {
            expression: "attribute_exists(#e) AND attribute_not_exists(#r) \
                AND (attribute_not_exists(#f) OR #f = :f OR #f = :g OR #f = :c)",
            names: names(&[("#e", KEY), ("#r", "rvn")]),
            values: Some(values(Vec::new())),
        },
        #[cfg(test)]
        Condition::HolderIs(_) => {
            return Err(StoreError::Other(
                "a holder-only condition is a model checker's defect, never written".into(),
            ));
        }
    })
}
