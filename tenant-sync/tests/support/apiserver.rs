//! An in-process stand-in for the Kubernetes API server (behaviour of
//! Kubernetes 1.33, core/v1 and discovery.k8s.io/v1): list and watch of
//! Namespaces, Secrets and (namespaced) EndpointSlices over HTTP (or
//! HTTPS, `start_tls`), so the real `kube` client and watcher code runs
//! against it; and the writing of events.k8s.io/v1 Events (`events`).
//!
//! It keeps a resourceVersion counter and an event log, filters by label
//! selector (`k=v`, `k`) and field selector (`type=`, `metadata.namespace=`),
//! streams watch events as newline-delimited JSON, sends a BOOKMARK once a
//! watch has caught up, and answers a watch from a compacted resourceVersion
//! with `410 Expired` as the real server does. Tests change objects, compact
//! the log, hold a list, or cut every watch.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch, Notify};

pub mod events;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Secret,
    EndpointSlice,
}

impl Kind {
    /// `(apiVersion, kind)` of its objects.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Kind::Namespace => ("v1", "Namespace"),
            Kind::Secret => ("v1", "Secret"),
            Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
        }
    }
}

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: Kind,
    kind_type: &'static str,
    object: Value,
}

#[derive(Default)]
struct Data {
    rv: u64,
    objects: BTreeMap<(Kind, String), Value>,
    log: Vec<Change>,
    /// Watches from below this resourceVersion get 410.
    compacted_below: u64,
}

struct State {
    data: Mutex<Data>,
    changes: broadcast::Sender<Change>,
    /// Bumped to end every open watch.
    cut: watch::Sender<u64>,
    /// While set, list (false) or watch (true) requests for that kind wait
    /// for `release`.
    held: Mutex<Option<(Kind, bool)>>,
    release: Notify,
    requests: watch::Sender<Vec<String>>,
    events: events::Events,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiServer {
    pub async fn start() -> Self {
        Self::serving(None).await
    }

    /// Over TLS, as a real API server serves only HTTPS.
    pub async fn start_tls(config: rustls::ServerConfig) -> Self {
        Self::serving(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn serving(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            data: Mutex::default(),
            changes: broadcast::channel(100_000).0,
            cut: watch::Sender::new(0),
            held: Mutex::new(None),
            release: Notify::new(),
            requests: watch::Sender::new(Vec::new()),
            events: events::Events::default(),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                let service = service_fn(move |request| handle(state.clone(), request));
                let http = hyper::server::conn::http1::Builder::new();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let _ = match tls {
                        None => http.serve_connection(TokioIo::new(stream), service).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            Err(_) => return, // a failed handshake is the client's to report
                        },
                    };
                });
            }
        });
        Self { addr, state, task }
    }

    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    pub fn namespace(&self, name: &str, labels: Value) {
        self.annotated_namespace(name, labels, json!({}));
    }

    pub fn annotated_namespace(&self, name: &str, labels: Value, annotations: Value) {
        self.put(
            Kind::Namespace,
            name.to_owned(),
            json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
            }),
        );
    }

    /// A labelled basic-auth Secret. `data` values are plain strings.
    pub fn secret(&self, namespace: &str, name: &str, data: &[(&str, &str)], annotations: Value) {
        use base64::Engine;
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        self.put(
            Kind::Secret,
            format!("{namespace}/{name}"),
            json!({
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/basic-auth",
                "metadata": {
                    "name": name, "namespace": namespace,
                    "labels": {"tenant-proxy/credentials": "true"},
                    "annotations": annotations,
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "data": data,
            }),
        );
    }

    /// An EndpointSlice of `service` in `namespace`: one endpoint per pod,
    /// `Some(ready)` or `None` (condition absent, which counts as ready).
    pub fn endpoint_slice(
        &self,
        namespace: &str,
        name: &str,
        service: &str,
        pods: &[(&str, Option<bool>)],
    ) {
        let endpoints: Vec<Value> = pods
            .iter()
            .enumerate()
            .map(|(i, (pod, ready))| {
                let conditions = match ready {
                    Some(ready) => json!({"ready": ready}),
                    None => json!({}),
                };
                json!({
                    "addresses": [format!("10.0.0.{i}")],
                    "conditions": conditions,
                    "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": format!("pod-{pod}")},
                })
            })
            .collect();
        self.put(
            Kind::EndpointSlice,
            format!("{namespace}/{name}"),
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": name, "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": service},
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
            }),
        );
    }

    pub fn delete(&self, kind: Kind, key: &str) {
        let mut data = self.state.data.lock().unwrap();
        if let Some(mut object) = data.objects.remove(&(kind, key.to_owned())) {
            data.rv += 1;
            object["metadata"]["resourceVersion"] = json!(data.rv.to_string());
            record(&self.state, &mut data, kind, "DELETED", object);
        }
    }

    fn put(&self, kind: Kind, key: String, mut object: Value) {
        let mut data = self.state.data.lock().unwrap();
        data.rv += 1;
        object["metadata"]["resourceVersion"] = json!(data.rv.to_string());
        object["metadata"]["uid"] = json!(format!("uid-{key}"));
        let kind_type = if data.objects.contains_key(&(kind, key.clone())) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        data.objects.insert((kind, key), object.clone());
        record(&self.state, &mut data, kind, kind_type, object);
    }

    /// Forgets the event log: a watch resuming from before now gets 410.
    pub fn compact(&self) {
        let mut data = self.state.data.lock().unwrap();
        data.compacted_below = data.rv + 1;
        data.log.clear();
    }

    /// Ends every open watch (clients reconnect from their last resourceVersion).
    pub fn cut_watches(&self) {
        self.state.cut.send_modify(|n| *n += 1);
    }

    /// List requests for `kind` wait until `release`.
    pub fn hold_lists(&self, kind: Kind) {
        *self.state.held.lock().unwrap() = Some((kind, false));
    }

    /// Watch requests for `kind` wait until `release`.
    pub fn hold_watches(&self, kind: Kind) {
        *self.state.held.lock().unwrap() = Some((kind, true));
    }

    pub fn release(&self) {
        *self.state.held.lock().unwrap() = None;
        self.state.release.notify_waiters();
    }

    /// Waits until a request whose path and query contain `needle` arrived.
    pub async fn wait_for_request(&self, needle: &str) {
        self.wait_for_requests(needle, 1).await;
    }

    /// Waits until `count` requests containing `needle` arrived.
    pub async fn wait_for_requests(&self, needle: &str, count: usize) {
        let mut requests = self.state.requests.subscribe();
        let wait =
            requests.wait_for(|seen| seen.iter().filter(|r| r.contains(needle)).count() >= count);
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .expect("the request arrived within 10 s")
            .unwrap();
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.requests.borrow().clone()
    }

    /// Refuses (403) or takes Event writes from now on.
    pub fn forbid_events(&self, forbidden: bool) {
        self.state
            .events
            .forbidden
            .store(forbidden, std::sync::atomic::Ordering::Relaxed);
    }

    /// The Events stored so far.
    pub fn events(&self) -> Vec<Value> {
        self.state.events.stored()
    }

    /// Waits until `count` Events were created or patched.
    pub async fn wait_for_event_writes(&self, count: usize) {
        let mut writes = self.state.events.writes();
        let wait = writes.wait_for(|n| *n >= count);
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .expect("the Events arrived within 10 s")
            .unwrap();
    }
}

fn record(state: &State, data: &mut Data, kind: Kind, kind_type: &'static str, object: Value) {
    let change = Change {
        rv: data.rv,
        kind,
        kind_type,
        object,
    };
    data.log.push(change.clone());
    let _ = state.changes.send(change);
}

type Body = BoxBody<Bytes, Infallible>;

fn json_response(code: StatusCode, value: Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// What a request asks for.
struct Query {
    kind: Kind,
    namespace: Option<String>,
    labels: Vec<Requirement>,
    /// (field path, value, equal): `metadata.name`, `metadata.namespace`
    /// and, for Secrets, `type`.
    fields: Vec<(String, String, bool)>,
    watch: bool,
    rv: u64,
    bookmarks: bool,
}

/// One label requirement, as the API server's selector grammar reads the
/// forms tenant-sync can be given: `k=v`, `k==v`, `k!=v`, `k`, `!k`.
enum Requirement {
    Equal(String, String),
    NotEqual(String, String),
    Exists(String),
    Absent(String),
}

/// Label selectors in the forms above; anything else (the set-based `in`
/// and `notin`, which this stand-in does not read, or a malformed one) is
/// refused with 400, never matched loosely.
fn label_selector(text: &str) -> Result<Vec<Requirement>, String> {
    let valid = |key: &str| {
        !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    };
    let mut requirements = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let requirement = if let Some((k, v)) = part.split_once("!=") {
            Requirement::NotEqual(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Requirement::Equal(k.trim().into(), v.trim().into())
        } else if let Some(k) = part.strip_prefix('!') {
            Requirement::Absent(k.trim().into())
        } else {
            Requirement::Exists(part.into())
        };
        let key = match &requirement {
            Requirement::Equal(k, _) | Requirement::NotEqual(k, _) => k,
            Requirement::Exists(k) | Requirement::Absent(k) => k,
        };
        if !valid(key) || key.contains(' ') {
            return Err(format!("unable to parse requirement: {part:?}"));
        }
        requirements.push(requirement);
    }
    Ok(requirements)
}

/// Field selectors the real server supports for `kind` (`=`, `==`, `!=`);
/// any other field is 400 `field label not supported`, as there.
fn field_selector(kind: Kind, text: &str) -> Result<Vec<(String, String, bool)>, String> {
    let mut fields = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value, equal) = match part.split_once("!=") {
            Some((k, v)) => (k, v, false),
            None => match part.split_once("==").or_else(|| part.split_once('=')) {
                Some((k, v)) => (k, v, true),
                None => return Err(format!("invalid field selector: {part:?}")),
            },
        };
        let supported = match key {
            "metadata.name" => true,
            "metadata.namespace" => kind != Kind::Namespace,
            "type" => kind == Kind::Secret,
            _ => false,
        };
        if !supported {
            return Err(format!("field label not supported: {key}"));
        }
        fields.push((key.to_owned(), value.to_owned(), equal));
    }
    Ok(fields)
}

impl Query {
    fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        let namespace_ok = self
            .namespace
            .as_deref()
            .is_none_or(|ns| meta["namespace"] == ns);
        let label = |k: &str| meta["labels"][k].as_str();
        let labels_ok = self.labels.iter().all(|r| match r {
            Requirement::Equal(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEqual(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::Absent(k) => label(k).is_none(),
        });
        let fields_ok = self.fields.iter().all(|(k, v, equal)| {
            let actual = match k.as_str() {
                "type" => &object["type"],
                "metadata.name" => &meta["name"],
                _ => &meta["namespace"],
            };
            (actual.as_str() == Some(v.as_str())) == *equal
        });
        namespace_ok && labels_ok && fields_ok
    }
}

/// `None`: no such collection (404); `Some(Err)`: a selector the real
/// server refuses (400).
fn parse(request: &Request<Incoming>) -> Option<Result<Query, String>> {
    let path: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    let (kind, namespace) = match path.as_slice() {
        ["api", "v1", "namespaces"] => (Kind::Namespace, None),
        ["api", "v1", "secrets"] => (Kind::Secret, None),
        ["api", "v1", "namespaces", ns, "secrets"] => (Kind::Secret, Some((*ns).to_owned())),
        ["apis", "discovery.k8s.io", "v1", "namespaces", ns, "endpointslices"] => {
            (Kind::EndpointSlice, Some((*ns).to_owned()))
        }
        _ => return None,
    };
    let params: Vec<(String, String)> =
        form_urlencoded::parse(request.uri().query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let get = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let selectors = label_selector(&get("labelSelector").unwrap_or_default()).and_then(|labels| {
        Ok((
            labels,
            field_selector(kind, &get("fieldSelector").unwrap_or_default())?,
        ))
    });
    Some(selectors.map(|(labels, fields)| {
        Query {
            kind,
            namespace,
            labels,
            fields,
            watch: matches!(get("watch").as_deref(), Some("true" | "1")),
            rv: get("resourceVersion")
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(0),
            bookmarks: get("allowWatchBookmarks").as_deref() == Some("true"),
        }
    }))
}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let seen = format!(
        "{}?{}",
        request.uri().path(),
        request.uri().query().unwrap_or_default()
    );
    state.requests.send_modify(|all| all.push(seen));
    if let Some(target) = events::route(&request) {
        return Ok(state.events.write(request, target).await);
    }
    let query = match parse(&request) {
        None => {
            return Ok(json_response(
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "code": 404}),
            ))
        }
        Some(Err(message)) => {
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": message, "reason": "BadRequest", "code": 400}),
            ))
        }
        Some(Ok(query)) => query,
    };
    loop {
        let notified = state.release.notified();
        if *state.held.lock().unwrap() != Some((query.kind, query.watch)) {
            break;
        }
        notified.await;
    }
    if query.watch {
        return Ok(watch_response(state, query));
    }
    let data = state.data.lock().unwrap();
    let items: Vec<Value> = data
        .objects
        .iter()
        .filter(|((kind, _), object)| *kind == query.kind && query.matches(object))
        .map(|(_, object)| object.clone())
        .collect();
    let (api_version, kind) = query.kind.names();
    Ok(json_response(
        StatusCode::OK,
        json!({
            "apiVersion": api_version, "kind": format!("{kind}List"),
            "metadata": {"resourceVersion": data.rv.to_string()},
            "items": items,
        }),
    ))
}

fn event_line(kind_type: &str, object: &Value) -> Bytes {
    Bytes::from(format!(
        "{}\n",
        json!({"type": kind_type, "object": object})
    ))
}

fn watch_response(state: Arc<State>, query: Query) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    // Subscribe before reading the log, so no change falls in between.
    let mut live = state.changes.subscribe();
    let mut cut = state.cut.subscribe();
    cut.borrow_and_update();
    let (backlog, current, expired) = {
        let data = state.data.lock().unwrap();
        let expired = query.rv != 0 && query.rv < data.compacted_below;
        let backlog: Vec<Change> = data
            .log
            .iter()
            .filter(|c| c.rv > query.rv)
            .cloned()
            .collect();
        (backlog, data.rv, expired)
    };
    tokio::spawn(async move {
        if expired {
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "too old resource version", "reason": "Expired", "code": 410});
            let _ = tx.send(event_line("ERROR", &status)).await;
            return;
        }
        let mut last = query.rv;
        for change in backlog {
            last = change.rv;
            if change.kind == query.kind && query.matches(&change.object) {
                let _ = tx.send(event_line(change.kind_type, &change.object)).await;
            }
        }
        if query.bookmarks {
            let (api_version, kind) = query.kind.names();
            let bookmark = json!({"kind": kind, "apiVersion": api_version,
                "metadata": {"resourceVersion": current.max(last).to_string()}});
            let _ = tx.send(event_line("BOOKMARK", &bookmark)).await;
        }
        loop {
            tokio::select! {
                _ = cut.changed() => return,
                change = live.recv() => match change {
                    Ok(change) if change.rv > last => {
                        last = change.rv;
                        if change.kind == query.kind && query.matches(&change.object)
                            && tx.send(event_line(change.kind_type, &change.object)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}
