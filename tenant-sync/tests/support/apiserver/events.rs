//! events.k8s.io/v1 Events as the API server (Kubernetes 1.33) takes them:
//! created by POST and merge-patched by PATCH (kube's `Recorder` does
//! both), each checked as `pkg/apis/core/validation/events.go` checks an
//! Event of that API version (`ValidateEventCreate`, `ValidateEventUpdate`)
//! and as the API server checks a request's namespace. Stored Events are
//! kept for tests to read; a test can have every write refused (403) as
//! RBAC without the Event rule would. Skipped: list, watch, get and delete (nothing
//! here reads Events back), and the Event TTL.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::{json_response, Body};

#[derive(Default)]
pub(super) struct Events {
    /// By `(namespace, name)`.
    stored: Mutex<BTreeMap<(String, String), Value>>,
    /// While set, every write is 403, as for a service account whose role
    /// lacks the Event rule.
    pub(super) forbidden: AtomicBool,
    /// Events created or patched so far.
    writes: watch::Sender<usize>,
}

/// `(namespace, name)` of an Events path: the collection (POST) or one
/// Event (PATCH).
pub(super) fn route(request: &Request<Incoming>) -> Option<(String, Option<String>)> {
    let path: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    match path.as_slice() {
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"] => Some(((*ns).into(), None)),
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events", name] => {
            Some(((*ns).into(), Some((*name).into())))
        }
        _ => None,
    }
}

impl Events {
    pub(super) async fn write(
        &self,
        request: Request<Incoming>,
        (namespace, name): (String, Option<String>),
    ) -> Response<Body> {
        if self.forbidden.load(Ordering::Relaxed) {
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("events.events.k8s.io is forbidden: User \"system:serviceaccount:observability:tenant-proxy\" cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"{namespace}\""),
            );
        }
        let method = request.method().clone();
        let content_type = request
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = request.into_body().collect().await.unwrap().to_bytes();
        let Ok(sent) = serde_json::from_slice::<Value>(&body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
        };
        let answer = match (method, name) {
            (Method::POST, None) => self.create(&namespace, sent),
            (Method::PATCH, Some(name)) if content_type == "application/merge-patch+json" => {
                self.patch(&namespace, &name, &sent)
            }
            (Method::PATCH, Some(_)) => Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format: {content_type}"),
            )),
            _ => Err((
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource".into(),
            )),
        };
        match answer {
            Ok((code, event)) => {
                self.writes.send_modify(|n| *n += 1);
                json_response(code, event)
            }
            Err((code, reason, message)) => status(code, reason, message),
        }
    }

    fn create(&self, namespace: &str, mut event: Value) -> Result<(StatusCode, Value), Refusal> {
        same_namespace(namespace, &event)?;
        invalid(validate_create(namespace, &event))?;
        let name = event["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut stored = self.stored.lock().unwrap();
        let key = (namespace.to_owned(), name.clone());
        if stored.contains_key(&key) {
            return Err((
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("events.events.k8s.io \"{name}\" already exists"),
            ));
        }
        event["metadata"]["uid"] = json!(format!("event-{namespace}-{name}"));
        event["metadata"]["resourceVersion"] = json!("1");
        stored.insert(key, event.clone());
        Ok((StatusCode::CREATED, event))
    }

    fn patch(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<(StatusCode, Value), Refusal> {
        let mut stored = self.stored.lock().unwrap();
        let key = (namespace.to_owned(), name.to_owned());
        let Some(old) = stored.get(&key) else {
            return Err((
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("events.events.k8s.io \"{name}\" not found"),
            ));
        };
        let mut new = old.clone();
        merge(&mut new, patch);
        same_namespace(namespace, &new)?;
        invalid(validate_update(&new, old))?;
        stored.insert(key, new.clone());
        Ok((StatusCode::OK, new))
    }

    /// Every stored Event.
    pub(super) fn stored(&self) -> Vec<Value> {
        self.stored.lock().unwrap().values().cloned().collect()
    }

    pub(super) fn writes(&self) -> watch::Receiver<usize> {
        self.writes.subscribe()
    }
}

type Refusal = (StatusCode, &'static str, String);

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// The API server refuses an object naming another namespace than its path.
fn same_namespace(namespace: &str, event: &Value) -> Result<(), Refusal> {
    match event["metadata"]["namespace"].as_str() {
        None => Ok(()),
        Some(ns) if ns == namespace => Ok(()),
        Some(_) => Err((
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        )),
    }
}

fn invalid(errors: Vec<String>) -> Result<(), Refusal> {
    match errors.is_empty() {
        true => Ok(()),
        false => Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("Event is invalid: {}", errors.join(", ")),
        )),
    }
}

/// RFC 7386.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            target.as_object_mut().unwrap().remove(key);
        } else {
            merge(&mut target[key], value);
        }
    }
}

fn text<'v>(event: &'v Value, field: &str) -> &'v str {
    event[field].as_str().unwrap_or_default()
}

/// `ValidateEventCreate` for events.k8s.io/v1: the legacy checks of an
/// Event with `eventTime`, then the strict ones.
pub fn validate_create(namespace: &str, event: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    if !is_dns_subdomain(name) {
        errors.push(format!("metadata.name: Invalid value: {name:?}"));
    }
    if text(event, "eventTime").is_empty() {
        errors.push("eventTime: Required value".into());
    }
    if event["regarding"]["namespace"]
        .as_str()
        .is_none_or(str::is_empty)
        && namespace != "default"
        && namespace != "kube-system"
    {
        errors
            .push("involvedObject.namespace: Invalid value: does not match event.namespace".into());
    }
    let controller = text(event, "reportingController");
    if controller.is_empty() || !is_qualified_name(controller) {
        errors.push(format!(
            "reportingController: Invalid value: {controller:?}"
        ));
    }
    for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        match text(event, field).len() {
            0 => errors.push(format!("{field}: Required value")),
            n if n > limit => {
                errors.push(format!("{field}: Too long: may not be more than {limit}"))
            }
            _ => {}
        }
    }
    if text(event, "note").len() > 1024 {
        errors.push("note: Too long: may not be more than 1024".into());
    }
    if !matches!(text(event, "type"), "Normal" | "Warning") {
        errors.push(format!("type: Invalid value: {:?}", event["type"]));
    }
    for legacy in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
        "deprecatedSource",
    ] {
        if !event[legacy].is_null() {
            errors.push(format!("{legacy}: Invalid value: needs to be unset"));
        }
    }
    errors.extend(validate_series(event));
    errors
}

/// `ValidateEventUpdate` for events.k8s.io/v1: only the series may change.
pub fn validate_update(new: &Value, old: &Value) -> Vec<String> {
    let mut errors = validate_series(new);
    for field in [
        "regarding",
        "related",
        "reason",
        "note",
        "type",
        "eventTime",
        "action",
        "reportingController",
        "reportingInstance",
    ] {
        if new[field] != old[field] {
            errors.push(format!("{field}: Invalid value: field is immutable"));
        }
    }
    errors
}

fn validate_series(event: &Value) -> Vec<String> {
    let series = &event["series"];
    if series.is_null() {
        return Vec::new();
    }
    let mut errors = Vec::new();
    if series["count"].as_i64().is_none_or(|n| n < 2) {
        errors.push("series.count: Invalid value: should be at least 2".into());
    }
    if text(series, "lastObservedTime").is_empty() {
        errors.push("series.lastObservedTime: Required value".into());
    }
    errors
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// A name with an optional DNS-subdomain prefix (`example.com/name`).
fn is_qualified_name(name: &str) -> bool {
    let (prefix, name) = name.rsplit_once('/').unwrap_or(("", name));
    (prefix.is_empty() || is_dns_subdomain(prefix))
        && (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}
