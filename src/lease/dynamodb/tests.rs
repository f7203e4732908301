//! Unit tests of the DynamoDB store's pieces that need no server.
use std::sync::atomic::{AtomicU32, Ordering};

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ConnectorError, ErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::get_item::GetItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;

use super::codec::{decode_value, encode_value, fingerprint};
use super::errors::Action;
use super::*;
use crate::lease::{HolderMeta, Malformed, RvnGuard};

fn response(status: u16) -> HttpResponse {
    HttpResponse::new(status.try_into().expect("valid status code"), "".into())
}

fn service_error(code: &str, status: u16) -> SdkError<GetItemError> {
    let meta = ErrorMetadata::builder()
        .code(code)
        .message("said the server")
        .build();
    SdkError::service_error(GetItemError::generic(meta), response(status))
}

fn classified(err: SdkError<GetItemError>) -> StoreError {
    classify(&err, Action::GetItem, "leases", Duration::from_secs(1))
}

/// An answer whose body the SDK could not read as DynamoDB's JSON: no code,
/// no message, only the status and the raw body.
fn unreadable(status: u16, body: &str) -> SdkError<GetItemError> {
    let raw = HttpResponse::new(
        status.try_into().expect("valid status code"),
        body.to_owned().into(),
    );
    SdkError::service_error(GetItemError::generic(ErrorMetadata::builder().build()), raw)
}

#[test]
fn a_denied_call_names_its_action_and_the_policy_fix() {
    // DynamoDB itself: 400 and AccessDeniedException.
    let e = classify(
        &service_error("AccessDeniedException", 400),
        Action::BatchGetItem,
        "leases",
        Duration::from_secs(1),
    );
    assert_eq!(e.metric_label(), "denied");
    assert!(!e.maybe_applied());
    assert_eq!(e.renew_label(), "error");
    let said = e.to_string();
    assert!(
        said.starts_with("not allowed to call dynamodb:BatchGetItem on table `leases`")
            && said.contains("AccessDeniedException: said the server")
            && said.contains("add dynamodb:BatchGetItem to the IAM policy")
            && said.contains("config/iam/README.md")
            && !said.contains('\n'),
        "{said}"
    );

    // moto, or a proxy: 403 and the query APIs' XML, which the SDK's JSON
    // parser reads no code from.
    let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<ErrorResponse><Errors><Error><Code>AccessDenied</Code><Message>User: arn:aws:iam::123456789012:user/u is not authorized to perform: dynamodb:Scan &amp; more</Message><Type>Sender</Type></Error></Errors></ErrorResponse>"#;
    let e = classified(unreadable(403, xml));
    assert_eq!(
        e,
        StoreError::Denied {
            action: "dynamodb:GetItem",
            table: "leases".into(),
            detail: "AccessDenied: User: arn:aws:iam::123456789012:user/u is not authorized to perform: dynamodb:Scan & more".into(),
        }
    );

    // A bare 403: forbidden, nothing more said.
    let e = classified(unreadable(403, ""));
    assert!(
        matches!(&e, StoreError::Denied { action: "dynamodb:GetItem", detail, .. } if detail == "HTTP 403"),
        "{e:?}"
    );
}

#[test]
fn unknown_or_badly_signed_credentials_are_not_a_denial() {
    // moto answers an unknown key with 403 and this XML.
    let xml = "<ErrorResponse><Errors><Error><Code>InvalidClientTokenId</Code>\
        <Message>The security token included in the request is invalid.</Message>\
        </Error></Errors></ErrorResponse>";
    let e = classified(unreadable(403, xml));
    assert_eq!(
        e,
        StoreError::Credentials(
            "InvalidClientTokenId: The security token included in the request is invalid.".into()
        )
    );
    // Neither is an unreadable answer of another status.
    let e = classified(unreadable(400, "{not json"));
    assert_eq!(e, StoreError::Other("HTTP 400".into()));
    let e = classified(unreadable(502, "<html>bad gateway</html>"));
    assert_eq!(e, StoreError::Server("HTTP 502".into()));
}

#[test]
fn service_errors_are_classified_by_code() {
    for code in [
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
    ] {
        assert!(
            matches!(
                classified(service_error(code, 400)),
                StoreError::Throttled(_)
            ),
            "{code}"
        );
    }
    assert_eq!(
        classified(service_error("ResourceNotFoundException", 400)),
        StoreError::TableMissing("leases".into())
    );
    for code in [
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
    ] {
        let e = classified(service_error(code, 400));
        assert!(
            matches!(&e, StoreError::Credentials(m) if m.contains(code)),
            "{code}: {e:?}"
        );
    }
    for (code, status) in [
        ("InternalServerError", 500),
        ("ServiceUnavailable", 503),
        ("SomethingNew", 502),
    ] {
        assert!(
            matches!(
                classified(service_error(code, status)),
                StoreError::Server(_)
            ),
            "{code}"
        );
    }
    let e = classified(service_error("ValidationException", 400));
    assert_eq!(
        e,
        StoreError::Other("ValidationException: said the server".into())
    );
}

#[test]
fn transport_failures_before_sending_are_not_ambiguous() {
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    let e = classified(SdkError::dispatch_failure(ConnectorError::io(Box::new(
        refused,
    ))));
    assert!(matches!(e, StoreError::Transport(_)), "{e:?}");
    assert!(!e.maybe_applied());

    // A connection that broke later may have carried the request.
    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
    let e = classified(SdkError::dispatch_failure(ConnectorError::io(Box::new(
        reset,
    ))));
    assert!(e.maybe_applied(), "{e:?}");

    let e = classified(SdkError::timeout_error("attempt timed out"));
    assert_eq!(e, StoreError::Timeout(Duration::from_secs(1)));
    assert!(e.maybe_applied());
}

#[test]
fn missing_credentials_are_a_credentials_error() {
    let missing = aws_credential_types::provider::error::CredentialsError::not_loaded(
        "no providers in chain provided credentials",
    );
    let e = classified(SdkError::dispatch_failure(ConnectorError::other(
        Box::new(missing),
        None,
    )));
    assert!(matches!(e, StoreError::Credentials(_)), "{e:?}");
    assert!(!e.maybe_applied());
}

#[test]
fn failed_condition_yields_the_old_item_when_given() {
    let old = lease_item(&sample_lease());
    let err = ConditionalCheckFailedException::builder()
        .set_item(Some(old.clone()))
        .build();
    let e: SdkError<PutItemError> = SdkError::service_error(
        PutItemError::ConditionalCheckFailedException(err),
        response(400),
    );
    assert_eq!(condition_failed(&e), Some(Some(&old)));
    let e: SdkError<PutItemError> = SdkError::service_error(
        PutItemError::ConditionalCheckFailedException(
            ConditionalCheckFailedException::builder().build(),
        ),
        response(400),
    );
    assert_eq!(condition_failed(&e), Some(None));
}

fn sample_lease() -> Lease {
    Lease {
        election: "report".into(),
        holder: Some("web-1".into()),
        rvn: "abc".into(),
        fencing_token: 7,
        lease_ms: 10_000,
        acquired_at_ms: 1_700_000_000_000,
        renewed_at_ms: 1_700_000_005_000,
        expires_at_s: 1_700_000_015,
        holder_meta: Some(HolderMeta {
            address: Some("10.0.0.1:9777".into()),
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            slots: None,
        }),
        successor: None,
        session: None,
    }
}

#[test]
fn lease_round_trips_and_release_drops_holder_meta() {
    let lease = sample_lease();
    assert_eq!(
        parse_item("report", &lease_item(&lease)),
        Record::Valid(lease.clone())
    );
    let released = Lease {
        holder: None,
        ..lease
    };
    let item = lease_item(&released);
    assert!(!item.contains_key("holder") && !item.contains_key("holder_meta"));
    assert_eq!(
        parse_item("report", &item),
        Record::Valid(Lease {
            holder_meta: None,
            ..released
        })
    );
}

fn malformed(item: &HashMap<String, AttributeValue>) -> Malformed {
    match parse_item("report", item) {
        Record::Malformed(m) => m,
        other => panic!("expected a malformed record, got {other:?}"),
    }
}

#[test]
fn malformed_items_name_the_attribute() {
    let good = lease_item(&sample_lease());

    let mut item = good.clone();
    item.remove("rvn");
    let m = malformed(&item);
    assert_eq!(m.problem, "attribute `rvn` is missing");
    assert_eq!(m.guard, RvnGuard::Missing);
    assert_eq!(m.fencing_token, Some(7));
    assert_eq!(m.election, "report");

    let mut item = good.clone();
    item.insert("rvn".into(), AttributeValue::N("42".into()));
    item.insert("fencing_token".into(), AttributeValue::S("7".into()));
    let m = malformed(&item);
    assert_eq!(m.problem, "attribute `rvn` is N, expected S");
    assert_eq!(m.fencing_token, None);
    let RvnGuard::Raw(raw) = &m.guard else {
        panic!("guard should carry the raw rvn")
    };
    assert_eq!(decode_value(raw), Some(AttributeValue::N("42".into())));

    let mut item = good.clone();
    item.insert("lease_ms".into(), AttributeValue::N("-5".into()));
    assert!(malformed(&item).problem.contains("`lease_ms`"));

    let mut item = good.clone();
    item.insert(
        "holder_meta".into(),
        AttributeValue::M(HashMap::from([(
            "labels".into(),
            AttributeValue::M(HashMap::from([("zone".into(), AttributeValue::Bool(true))])),
        )])),
    );
    assert_eq!(
        malformed(&item).problem,
        "attribute `holder_meta.labels.zone` is BOOL, expected S"
    );

    let mut item = good;
    item.insert("holder".into(), AttributeValue::Null(true));
    assert_eq!(
        malformed(&item).problem,
        "attribute `holder` is NULL, expected S"
    );
}

#[test]
fn fingerprint_changes_with_any_attribute_and_ignores_order() {
    let mut item = lease_item(&sample_lease());
    item.remove("rvn");
    item.insert(
        "tags".into(),
        AttributeValue::Ss(vec!["b".into(), "a".into()]),
    );
    let before = fingerprint(&item);
    let mut reordered = item.clone();
    reordered.insert(
        "tags".into(),
        AttributeValue::Ss(vec!["a".into(), "b".into()]),
    );
    assert_eq!(fingerprint(&reordered), before);
    item.insert("renewed_at".into(), AttributeValue::N("1".into()));
    assert_ne!(fingerprint(&item), before);
}

#[test]
fn every_attribute_type_round_trips_through_the_guard_encoding() {
    let values = [
        AttributeValue::S("x".into()),
        AttributeValue::N("1.5".into()),
        AttributeValue::B(Blob::new(vec![0, 255, 16])),
        AttributeValue::Ss(vec!["a".into(), "b".into()]),
        AttributeValue::Ns(vec!["1".into(), "2".into()]),
        AttributeValue::Bs(vec![Blob::new(vec![1]), Blob::new(vec![2])]),
        AttributeValue::M(HashMap::from([("k".into(), AttributeValue::Bool(false))])),
        AttributeValue::L(vec![
            AttributeValue::Null(true),
            AttributeValue::S("y".into()),
        ]),
        AttributeValue::Null(true),
        AttributeValue::Bool(true),
    ];
    for v in values {
        assert_eq!(decode_value(&encode_value(&v)), Some(v.clone()));
    }
    assert_eq!(decode_value("not json"), None);
    assert_eq!(decode_value(r#"{"B":"abc"}"#), None);
    assert!(matches!(
        condition_expression(&Condition::Unchanged(RvnGuard::Raw("x".into()))),
        Err(StoreError::Other(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn throttling_is_retried_until_success() {
    let calls = AtomicU32::new(0);
    let started = Instant::now();
    let result = retry_throttled(Duration::from_secs(5), |left| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            assert!(left <= Duration::from_secs(5));
            if n < 3 {
                Err(StoreError::Throttled("slow down".into()))
            } else {
                Ok(n)
            }
        }
    })
    .await;
    assert_eq!(result, Ok(3));
    // Three pauses of at most 20, 40, 80 ms, each plus up to its own jitter.
    assert!(started.elapsed() <= Duration::from_millis(280));
    assert!(started.elapsed() >= Duration::from_millis(20));
}

#[tokio::test(start_paused = true)]
async fn throttling_retries_stop_within_the_budget() {
    let calls = AtomicU32::new(0);
    let started = Instant::now();
    let budget = Duration::from_secs(2);
    let result: Result<(), _> = retry_throttled(budget, |left| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            // Every attempt is given what is left, and at least MIN_ATTEMPT.
            assert!(left >= MIN_ATTEMPT && left <= budget, "{left:?}");
            Err(StoreError::Throttled("slow down".into()))
        }
    })
    .await;
    assert_eq!(result, Err(StoreError::Throttled("slow down".into())));
    assert!(started.elapsed() <= budget);
    assert!(calls.load(Ordering::SeqCst) >= 4, "retried a few times");
}

#[tokio::test(start_paused = true)]
async fn other_errors_are_not_retried() {
    for err in [
        StoreError::Timeout(Duration::from_secs(1)),
        StoreError::Transport("refused".into()),
        StoreError::Credentials("expired".into()),
    ] {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = retry_throttled(Duration::from_secs(5), |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            let err = err.clone();
            async move { Err(err) }
        })
        .await;
        assert_eq!(result, Err(err));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn every_item_carries_format_1_and_one_without_it_is_format_1() {
    let item = lease_item(&sample_lease());
    assert_eq!(item.get("format"), Some(&AttributeValue::N("1".into())));
    let mut old = item.clone();
    old.remove("format");
    assert_eq!(parse_item("report", &old), Record::Valid(sample_lease()));
}

#[test]
fn any_other_format_is_unknown_whatever_the_rest_of_the_item() {
    let unknown = |format: AttributeValue, spoil: bool| {
        let mut item = lease_item(&sample_lease());
        item.insert("format".into(), format);
        if spoil {
            item.remove("rvn");
        }
        match parse_item("report", &item) {
            Record::UnknownFormat(u) => u,
            other => panic!("expected an unknown format, got {other:?}"),
        }
    };
    let u = unknown(AttributeValue::N("4".into()), false);
    assert_eq!((u.election.as_str(), u.format.as_str()), ("report", "4"));
    assert_eq!(
        (u.holder.as_deref(), u.fencing_token),
        (Some("web-1"), Some(7))
    );
    assert_eq!(unknown(AttributeValue::N("4".into()), true).format, "4");
    assert_eq!(
        unknown(AttributeValue::S("x".into()), false).format,
        "\"x\""
    );
    assert_eq!(
        unknown(AttributeValue::S("1".into()), false).format,
        "\"1\""
    );
    assert_eq!(
        unknown(AttributeValue::N("1.5".into()), false).format,
        "1.5"
    );
    assert_eq!(
        unknown(AttributeValue::Bool(true), false).format,
        "{\"BOOL\":true}"
    );
    assert_ne!(
        unknown(AttributeValue::N("5".into()), false).fingerprint,
        unknown(AttributeValue::N("4".into()), false).fingerprint
    );
}

/// The `#name` and `:value` placeholders of an expression.
fn placeholders(expression: &str, sigil: char) -> std::collections::BTreeSet<String> {
    expression
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == sigil))
        .filter(|w| w.starts_with(sigil))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_write_over_an_item_requires_a_known_format() {
    let guard = RvnGuard::Raw(encode_value(&AttributeValue::S("abc".into())));
    let over_an_item = [
        Condition::RvnIs("abc".into()),
        Condition::HeldBy {
            rvn: "abc".into(),
            holder: "web-1".into(),
        },
        Condition::Unchanged(guard),
        Condition::Unchanged(RvnGuard::Missing),
    ];
    for condition in over_an_item.iter().chain([&Condition::NotExists]) {
        let c = condition_expression(condition).expect("an expression");
        // DynamoDB refuses a placeholder the expression does not use.
        let names: std::collections::BTreeSet<String> = c.names.keys().cloned().collect();
        assert_eq!(placeholders(c.expression, '#'), names, "{condition:?}");
        let values: std::collections::BTreeSet<String> =
            c.values.iter().flatten().map(|(k, _)| k.clone()).collect();
        assert_eq!(placeholders(c.expression, ':'), values, "{condition:?}");
        if *condition == Condition::NotExists {
            assert_eq!(c.expression, "attribute_not_exists(#e)");
            continue;
        }
        assert!(
            c.expression
                .ends_with(" AND (attribute_not_exists(#f) OR #f = :f OR #f = :g OR #f = :c)"),
            "{condition:?}: {}",
            c.expression
        );
        assert_eq!(c.names.get("#f").map(String::as_str), Some("format"));
        assert_eq!(
            c.values.as_ref().and_then(|v| v.get(":f")),
            Some(&AttributeValue::N("1".into()))
        );
        assert_eq!(
            c.values.as_ref().and_then(|v| v.get(":g")),
            Some(&AttributeValue::N("2".into()))
        );
    }
}

#[test]
fn a_record_held_through_a_session_and_a_session_record_are_format_2() {
    let key = "#session/web-1/abc";
    let held = Lease {
        session: Some(key.into()),
        ..sample_lease()
    };
    let item = lease_item(&held);
    assert_eq!(item.get("format"), Some(&AttributeValue::N("2".into())));
    assert_eq!(item.get("session"), Some(&AttributeValue::S(key.into())));
    // Its own lease is stored as a hundred years, for readers that would
    // time it as a plain lease; a session record keeps its own.
    assert_eq!(
        item.get("lease_ms"),
        Some(&AttributeValue::N("3155760000000".into()))
    );
    let stored = Lease {
        lease_ms: crate::lease::HELD_THROUGH_SESSION_LEASE_MS,
        ..held
    };
    assert_eq!(parse_item("report", &item), Record::Valid(stored));
    let session = Lease {
        election: key.into(),
        ..sample_lease()
    };
    let item = lease_item(&session);
    assert_eq!(item.get("format"), Some(&AttributeValue::N("2".into())));
    assert_eq!(
        item.get("lease_ms"),
        Some(&AttributeValue::N("10000".into()))
    );
    assert_eq!(parse_item(key, &item), Record::Valid(session));
    let mut wrong = lease_item(&sample_lease());
    wrong.insert("session".into(), AttributeValue::N("1".into()));
    assert_eq!(
        malformed(&wrong).problem,
        "attribute `session` is N, expected S"
    );
}

/// A store whose every request that goes out fails at once (nothing
/// listens on the endpoint), with no credentials to look up.
async fn unreachable_store() -> DynamoStore {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:1")
        .credentials_provider(aws_credential_types::Credentials::for_tests())
        .http_client(https_client())
        .build();
    DynamoStore::from_client(&Client::from_conf(conf), "leases")
}

#[tokio::test]
async fn a_burst_queues_for_a_slot_and_a_renewal_never_waits() {
    let store = unreachable_store().await;
    let _busy: Vec<_> = (0..IN_FLIGHT)
        .map(|_| store.slots.try_acquire().expect("a free slot"))
        .collect();
    let budget = Duration::from_millis(200);
    let started = Instant::now();
    let read = store.read("report", budget).await;
    assert!(
        matches!(&read, Err(StoreError::Transport(m)) if m.starts_with("not sent: 32 other requests")),
        "{read:?}"
    );
    assert!(started.elapsed() >= budget, "gave up early");
    assert!(!read.unwrap_err().maybe_applied());

    // A renewal goes out at once (and fails to connect); a release or a
    // takeover waits like the read.
    let lease = sample_lease();
    let holder = lease.holder.clone().expect("the sample is held");
    let renew = Condition::HeldBy {
        rvn: lease.rvn.clone(),
        holder,
    };
    let renewed = store.put(&lease, &renew, budget).await;
    assert!(
        !matches!(&renewed, Err(StoreError::Transport(m)) if m.starts_with("not sent")),
        "{renewed:?}"
    );
    let released = Lease {
        holder: None,
        ..lease.clone()
    };
    assert!(!renews(&released, &renew));
    assert!(!renews(&lease, &Condition::RvnIs(lease.rvn.clone())));
    assert!(renews(&lease, &renew));
}
