//! An in-process stand-in for Loki (behaviour of Loki 3.x with
//! `auth_enabled: true`): it refuses requests without exactly one
//! `X-Scope-OrgID`, stores pushed lines per tenant (a push body real Loki
//! would refuse is refused, see `loki_push`), answers queries with the
//! asking tenant's data only, and serves live tail over WebSocket. It records
//! every request so tests can assert on what the upstream actually received.
//! On `/api/v1/write` it plays a Prometheus 3 remote-write receiver instead
//! (no tenant header needed; see [`prometheus3_remote_write`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The trailer fields after a chunked body, if any came.
    pub trailers: Option<HeaderMap>,
}

impl Received {
    pub fn org_ids(&self) -> Vec<String> {
        self.headers
            .get_all("x-scope-orgid")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    /// `key` as Loki's label-based access control reads it before
    /// rewriting a volume or aggregated-metric query (`pkg/labelaccess`,
    /// `r.URL.Query().Get`): the URL's first value.
    pub fn read_by_label_policy(&self, key: &str) -> Option<String> {
        first(self.query.as_deref().unwrap_or_default().as_bytes(), key)
    }

    /// `key` as Loki's handlers read it (`r.ParseForm`, then `r.Form`):
    /// on a POST, PUT or PATCH with a form body the body's first value,
    /// else the URL's.
    pub fn read_by_handler(&self, key: &str) -> Option<String> {
        let form = self
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        let reads_body = matches!(self.method, Method::POST | Method::PUT | Method::PATCH);
        (form && reads_body)
            .then(|| first(&self.body, key))
            .flatten()
            .or_else(|| self.read_by_label_policy(key))
    }
}

fn first(form: &[u8], key: &str) -> Option<String> {
    form_urlencoded::parse(form)
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

struct State {
    received: Mutex<Vec<Received>>,
    /// How many requests arrived, so tests can wait for one without sleeping.
    arrivals: tokio::sync::watch::Sender<usize>,
    pushed: Mutex<HashMap<String, Vec<String>>>,
    /// Samples a Prometheus 3 OTLP receiver would have stored.
    otlp_samples: Mutex<Vec<super::otlp_metrics::Sample>>,
    /// Mimir's Alertmanager configuration per tenant, as stored.
    alertmanager_configs: Mutex<HashMap<String, String>>,
}

pub struct LokiStandIn {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LokiStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LokiStandIn {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            received: Mutex::default(),
            arrivals: tokio::sync::watch::Sender::new(0),
            pushed: Mutex::default(),
            otlp_samples: Mutex::default(),
            alertmanager_configs: Mutex::default(),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = shared.clone();
                let service = service_fn(move |request| handle(state.clone(), request));
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades(),
                );
            }
        });
        Self { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until `count` requests have arrived.
    pub async fn wait_for_requests(&self, count: usize) {
        let mut arrivals = self.state.arrivals.subscribe();
        tokio::time::timeout(Duration::from_secs(10), arrivals.wait_for(|n| *n >= count))
            .await
            .expect("requests arrived at the stand-in within 10 s")
            .unwrap();
    }

    /// Every sample the OTLP metrics endpoint would have stored.
    pub fn otlp_samples(&self) -> Vec<super::otlp_metrics::Sample> {
        self.state.otlp_samples.lock().unwrap().clone()
    }

    /// The series of every stored OTLP sample, once per sample.
    pub fn otlp_series(&self) -> Vec<super::otlp_metrics::Series> {
        self.otlp_samples().into_iter().map(|s| s.labels).collect()
    }

    pub fn last(&self) -> Received {
        self.received()
            .pop()
            .expect("the stand-in received a request")
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

/// Loki's ruler taking a posted rule group (`pkg/ruler/base/api.go`,
/// `CreateRuleGroup`): yaml.v3 into `rulefmt.RuleGroup`, unknown fields
/// ignored, a key defined twice refused, 400 `unable to decoded rule
/// group` when it does not read; then `ValidateRuleGroup` and
/// `rulefmt`'s `RuleNode.Validate`: a name; each rule exactly one of
/// `record` and `alert`, with an `expr`; label and annotation names valid
/// (the legacy charset, `__name__` excluded); a recording rule's name a
/// valid metric name, without `for` or annotations. 202 once taken. It
/// skips LogQL parsing of `expr`, per-tenant rule limits and storing
/// (tests read the body).
///
/// With `federation`, Mimir's (and Cortex's) ruler configuration API,
/// which reads the same way (`pkg/ruler/api.go`) into Mimir's `rulefmt`,
/// where `source_tenants` is a list of strings: anything else there does
/// not decode. It plays `-ruler.tenant-federation.enabled`, taking any
/// list, as Mimir does: checking it is the gateway's job.
fn rule_group(body: &[u8], federation: bool) -> Response<Full<Bytes>> {
    use serde_yaml_ng::Value;
    let unreadable = || reply(StatusCode::BAD_REQUEST, "unable to decoded rule group\n");
    let Ok(group) = serde_yaml_ng::from_slice::<Value>(body) else {
        return unreadable();
    };
    fn text<'v>(value: &'v Value, key: &str) -> Option<&'v str> {
        value
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }
    let name_ok = |name: &str, colons: bool| {
        let mut chars = name.chars();
        let allowed = |c: char| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':');
        chars.next().is_some_and(allowed) && chars.all(|c| allowed(c) || c.is_ascii_digit())
    };
    let names_ok = |rule: &Value, key: &str| match rule.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::Mapping(map)) => map.iter().all(|(k, _)| {
            k.as_str()
                .is_some_and(|k| name_ok(k, false) && k != "__name__")
        }),
        Some(_) => false,
    };
    let rule_ok = |rule: &Value| {
        let shape = text(rule, "record").is_some() != text(rule, "alert").is_some()
            && text(rule, "expr").is_some();
        let recording = text(rule, "record").is_none_or(|record| {
            name_ok(record, true) && rule.get("for").is_none() && rule.get("annotations").is_none()
        });
        shape && recording && names_ok(rule, "labels") && names_ok(rule, "annotations")
    };
    let rules_ok = match group.get("rules") {
        None | Some(Value::Null) => true,
        Some(Value::Sequence(rules)) => rules.iter().all(rule_ok),
        Some(_) => false,
    };
    let sources_ok = !federation
        || match group.get("source_tenants") {
            None | Some(Value::Null) => true,
            Some(Value::Sequence(sources)) => sources.iter().all(Value::is_string),
            Some(_) => false,
        };
    if !group.is_mapping() || !sources_ok {
        return unreadable();
    }
    if text(&group, "name").is_none() {
        return reply(
            StatusCode::BAD_REQUEST,
            "rule group name must not be empty\n",
        );
    }
    if !rules_ok {
        return reply(StatusCode::BAD_REQUEST, "invalid rule\n");
    }
    reply(
        StatusCode::ACCEPTED,
        r#"{"status":"success","data":null,"errorType":"","error":""}"#,
    )
}

async fn handle(
    state: Arc<State>,
    mut request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let upgrade = hyper::upgrade::on(&mut request);
    let (parts, body) = request.into_parts();
    let (body, trailers) = match body.collect().await {
        Ok(collected) => {
            let trailers = collected.trailers().cloned();
            (collected.to_bytes(), trailers)
        }
        Err(_) => Default::default(),
    };
    let received = Received {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers: parts.headers.clone(),
        body: body.clone(),
        trailers,
    };
    state.received.lock().unwrap().push(received.clone());
    state.arrivals.send_modify(|n| *n += 1);

    if let Some(ms) = header_str(&parts.headers, "x-test-stall-ms") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
    }
    if let Some(code) = header_str(&parts.headers, "x-test-status") {
        let mut response = reply(StatusCode::from_bytes(code.as_bytes()).unwrap(), "forced");
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, "7".parse().unwrap());
        return Ok(response);
    }

    if received.path.ends_with("/api/v1/write") {
        return Ok(prometheus3_remote_write(&parts.headers, &body));
    }
    if received.path.ends_with("/api/v1/otlp/v1/metrics") {
        return Ok(match prometheus3_otlp(&parts.headers, &body) {
            Ok(samples) => {
                state.otlp_samples.lock().unwrap().extend(samples);
                reply(StatusCode::OK, "")
            }
            Err((status, text)) => reply(status, text),
        });
    }
    if received.path == "/api/v1/receive" {
        return Ok(thanos_receive(&state, &received));
    }
    if received.path == "/api/v1/rules" && received.org_ids().is_empty() {
        return Ok(prometheus3_rules(&received));
    }
    // Loki: exactly one org id, or the request is refused.
    let org_ids = received.org_ids();
    let tenant = match org_ids.as_slice() {
        [one] => one.clone(),
        [] => return Ok(reply(StatusCode::UNAUTHORIZED, "no org id\n")),
        _ => return Ok(reply(StatusCode::BAD_REQUEST, "multiple org ids\n")),
    };

    let path = received.path.as_str();
    if path == "/api/v1/alerts" {
        return Ok(mimir_alertmanager_config(
            &state,
            &parts.method,
            tenant,
            &body,
        ));
    }
    if parts.method == Method::POST {
        let loki = ["/loki/api/v1/rules/", "/api/prom/rules/"];
        if loki.iter().any(|ruler| path.starts_with(ruler)) {
            return Ok(rule_group(&body, false));
        }
        if path.starts_with("/prometheus/config/v1/rules/") {
            return Ok(rule_group(&body, true));
        }
    }
    let pushed = if path.ends_with("/loki/api/v1/push") || path.ends_with("/api/prom/push") {
        Some(super::loki_push::lines(path, &parts.headers, &body))
    } else if path.ends_with("/otlp/v1/logs") {
        Some(otlp_decodes::<ExportLogsServiceRequest>(&parts.headers, &body).map(|()| lossy(&body)))
    } else if path.ends_with("/push") {
        Some(mimir_remote_write(&body).map(|()| lossy(&body)))
    } else if path.ends_with("/otlp/v1/metrics") {
        Some(
            otlp_decodes::<ExportMetricsServiceRequest>(&parts.headers, &body)
                .map(|()| lossy(&body)),
        )
    } else {
        None
    };
    if let Some(pushed) = pushed {
        return Ok(match pushed {
            Ok(lines) => {
                let mut stored = state.pushed.lock().unwrap();
                stored.entry(tenant).or_default().extend(lines);
                reply(StatusCode::NO_CONTENT, "")
            }
            Err((status, text)) => reply(status, text),
        });
    }
    if path.ends_with("/tail") {
        if let Err((status, refusal)) = websocket_handshake(&parts.method, &parts.headers) {
            return Ok(reply(status, refusal));
        }
        return Ok(accept_websocket(&parts.headers, upgrade, tenant));
    }
    let labels = path == "/loki/api/v1/labels" || path.starts_with("/loki/api/v1/label/");
    if let Some(query) = received.read_by_handler("query").filter(|_| labels) {
        if let Err(refusal) = stream_selector(&query) {
            return Ok(reply(StatusCode::BAD_REQUEST, refusal));
        }
    }
    let lines = state
        .pushed
        .lock()
        .unwrap()
        .get(&tenant)
        .cloned()
        .unwrap_or_default();
    let body = serde_json::json!({
        "status": "success",
        "data": {"resultType": "streams", "tenant": tenant, "result": lines},
    });
    Ok(reply(StatusCode::OK, body.to_string()))
}

/// The rule groups [`prometheus3_rules`] lists, by group name and the
/// `namespace` its one alerting rule's labels name, in the order
/// Prometheus lists groups (by file, then name).
const PROMETHEUS_RULE_GROUPS: [(&str, &str); 3] = [
    ("a-first", "team-a"),
    ("b-only", "team-b"),
    ("c-also-a", "team-a"),
];

/// `GET /api/v1/rules` of a Prometheus 3.x holding every tenant's groups in
/// one file (`web/api/v1/api.go`, `rules`, with the paging of 3.x): with
/// `group_limit` (a positive integer, else 400) at most that many groups and
/// `groupNextToken` naming the first group left out; `group_next_token`
/// only with `group_limit` (else 400), starting at the group it names (400
/// if none). Prometheus's token is a hash of the group's file and name in
/// hex; here the hex of `file;name` itself, which the proxy can as little
/// tell from a real one.
/// Skipped: the rule filters (`type`, `rule_name[]`, ...), alerts' states.
fn prometheus3_rules(received: &Received) -> Response<Full<Bytes>> {
    const FILE: &str = "/etc/prometheus/rules.yaml";
    let token = |name: &str| {
        (format!("{FILE};{name}").bytes())
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let bad = |why: &str| {
        let body = serde_json::json!({"status": "error", "errorType": "bad_data", "error": why});
        reply(StatusCode::BAD_REQUEST, body.to_string())
    };
    let limit = match received.read_by_label_policy("group_limit") {
        None => None,
        Some(text) => match text.parse::<usize>() {
            Ok(limit) if limit > 0 => Some(limit),
            _ => return bad("group_limit needs to be a positive number"),
        },
    };
    let start = match received.read_by_label_policy("group_next_token") {
        None => 0,
        Some(_) if limit.is_none() => {
            return bad("group_limit needs to be present in order to paginate over the groups")
        }
        Some(next) => {
            match (PROMETHEUS_RULE_GROUPS.iter()).position(|(name, _)| token(name) == next) {
                Some(at) => at,
                None => return bad("invalid group_next_token"),
            }
        }
    };
    let end = limit.map_or(PROMETHEUS_RULE_GROUPS.len(), |limit| {
        (start + limit).min(PROMETHEUS_RULE_GROUPS.len())
    });
    let groups: Vec<serde_json::Value> = PROMETHEUS_RULE_GROUPS[start..end]
        .iter()
        .map(|(name, namespace)| {
            serde_json::json!({
                "name": name, "file": FILE, "interval": 60, "limit": 0,
                "rules": [{"name": format!("{name}-alert"), "type": "alerting",
                           "query": "vector(1)", "labels": {"namespace": namespace},
                           "alerts": [], "health": "ok", "state": "inactive"}],
            })
        })
        .collect();
    let mut data = serde_json::json!({ "groups": groups });
    if let Some((next, _)) = PROMETHEUS_RULE_GROUPS.get(end) {
        data["groupNextToken"] = token(next).into();
    }
    let body = serde_json::json!({"status": "success", "data": data});
    reply(StatusCode::OK, body.to_string())
}

/// The `query` of a label names or values request, as Loki's querier reads
/// it (`syntax.ParseMatchers(query, true)`, Loki 3.x): matchers alone in
/// `{...}`, at least one of which cannot match the empty value
/// (`validateMatchers`), else 400. Read here with promql-parser, whose
/// matcher syntax is LogQL's but for quoting (it takes `'...'`, Loki does
/// not; it reads escapes in backquotes, Loki does not).
fn stream_selector(query: &str) -> Result<(), String> {
    use promql_parser::parser::{self, Expr};
    let Ok(Expr::VectorSelector(selector)) = parser::parse(query) else {
        return Err(format!("parse error: {query:?} is not a stream selector\n"));
    };
    let plain = selector.name.is_none()
        && selector.offset.is_none()
        && selector.at.is_none()
        && selector.matchers.or_matchers.is_empty();
    if !plain {
        return Err(format!("parse error: {query:?} is not a stream selector\n"));
    }
    if selector.matchers.matchers.iter().all(|m| m.is_match("")) {
        return Err(
            "parse error : queries require at least one regexp or equality matcher \
                    that does not have an empty-compatible value\n"
                .into(),
        );
    }
    Ok(())
}

/// Mimir's Alertmanager configuration API at its root, per tenant, as
/// `pkg/alertmanager/api.go` (Mimir 2.x) answers: GET the stored YAML or 404,
/// POST a `{template_files, alertmanager_config}` YAML document (unknown keys
/// ignored, like yaml.v2; an empty `alertmanager_config` is 400) and 201,
/// DELETE 200 whether or not one was stored. Skipped: validating the
/// Alertmanager configuration itself (`config.Load`, refused `*_file`
/// settings, templates).
fn mimir_alertmanager_config(
    state: &State,
    method: &Method,
    tenant: String,
    body: &[u8],
) -> Response<Full<Bytes>> {
    #[derive(serde::Deserialize, serde::Serialize)]
    struct UserConfig {
        #[serde(default)]
        template_files: HashMap<String, String>,
        #[serde(default)]
        alertmanager_config: String,
    }
    let mut configs = state.alertmanager_configs.lock().unwrap();
    match *method {
        Method::GET => match configs.get(&tenant) {
            Some(stored) => {
                let mut response = reply(StatusCode::OK, stored.clone());
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, "application/yaml".parse().unwrap());
                response
            }
            None => reply(
                StatusCode::NOT_FOUND,
                "alertmanager storage object: not found\n",
            ),
        },
        Method::POST => match serde_yaml_ng::from_slice::<UserConfig>(body) {
            Ok(config) if config.alertmanager_config.is_empty() => reply(
                StatusCode::BAD_REQUEST,
                "error validating Alertmanager config: configuration provided is empty\n",
            ),
            Ok(config) => {
                configs.insert(tenant, serde_yaml_ng::to_string(&config).unwrap());
                reply(StatusCode::CREATED, "")
            }
            Err(e) => reply(
                StatusCode::BAD_REQUEST,
                format!("error marshalling YAML Alertmanager config: {e}\n"),
            ),
        },
        Method::DELETE => {
            configs.remove(&tenant);
            reply(StatusCode::OK, "")
        }
        _ => reply(StatusCode::METHOD_NOT_ALLOWED, ""),
    }
}

/// Prometheus 3.x's remote-write receiver, reading a request as
/// `storage/remote/write_handler.go` (v3.x) does: the media type compared
/// byte for byte (`Application/X-Protobuf` is 415 there), the first
/// `proto=` parameter picks the decoder, no `proto=` means 1.0, a coding
/// other than snappy (in any case) is 415, a body that does not decompress
/// or decode 400. A 2.0 write is confirmed with the samples it holds.
/// Stricter than the real one in one way: prost refuses strings that are not
/// UTF-8, gogo does not. It stores nothing: tests read what it received.
fn prometheus3_remote_write(headers: &HeaderMap, body: &[u8]) -> Response<Full<Bytes>> {
    use prost::Message;
    use tenant_proxy::enforce::prompb::{v2, WriteRequest};

    let content_type = header_str(headers, "content-type").unwrap_or("application/x-protobuf");
    let mut parts = content_type.trim().split(';');
    if parts.next() != Some("application/x-protobuf") {
        return reply(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected application/x-protobuf\n",
        );
    }
    let mut is_v2 = false;
    for parameter in parts {
        match parameter.split('=').collect::<Vec<_>>()[..] {
            ["proto", "prometheus.WriteRequest"] => break,
            ["proto", "io.prometheus.write.v2.Request"] => {
                is_v2 = true;
                break;
            }
            ["proto", _] | [_] | [_, _, _, ..] | [] => {
                return reply(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unknown proto\n")
            }
            [_, _] => {}
        }
    }
    if header_str(headers, "content-encoding").is_some_and(|e| !e.eq_ignore_ascii_case("snappy")) {
        return reply(StatusCode::UNSUPPORTED_MEDIA_TYPE, "only snappy\n");
    }
    let Ok(raw) = snap::raw::Decoder::new().decompress_vec(body) else {
        return reply(StatusCode::BAD_REQUEST, "snappy: corrupt input\n");
    };
    if !is_v2 {
        return match WriteRequest::decode(raw.as_slice()) {
            Ok(_) => reply(StatusCode::NO_CONTENT, ""),
            Err(e) => reply(StatusCode::BAD_REQUEST, format!("{e}\n")),
        };
    }
    let request = match v2::Request::decode(raw.as_slice()) {
        Ok(request) => request,
        Err(e) => return reply(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let symbols = request.symbols.len();
    let valid = |ts: &v2::TimeSeries| {
        ts.labels_refs.len() % 2 == 0 && ts.labels_refs.iter().all(|r| (*r as usize) < symbols)
    };
    if !request.timeseries.iter().all(valid) {
        return reply(StatusCode::BAD_REQUEST, "invalid label references\n");
    }
    let samples: usize = request.timeseries.iter().map(|ts| ts.samples.len()).sum();
    let mut response = reply(StatusCode::NO_CONTENT, "");
    response.headers_mut().insert(
        "x-prometheus-remote-write-samples-written",
        samples.to_string().parse().unwrap(),
    );
    response
}

/// A refusal by a stand-in endpoint: status and error text.
pub type Refusal = (StatusCode, String);

/// An OTLP body as the receiver reads it: gzip undone, size unbounded
/// (the proxy bounds it), protobuf or JSON by `Content-Type`.
fn otlp_body(headers: &HeaderMap, body: &[u8]) -> Result<(Vec<u8>, bool), Refusal> {
    let json = match header_str(headers, "content-type") {
        Some("application/x-protobuf") => false,
        Some("application/json") => true,
        _ => {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported content type".into(),
            ))
        }
    };
    let raw = match header_str(headers, "content-encoding") {
        None => body.to_vec(),
        Some("gzip") => {
            use std::io::Read;
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut raw)
                .map_err(|e| (StatusCode::BAD_REQUEST, format!("gzip: {e}")))?;
            raw
        }
        Some(_) => {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported encoding".into(),
            ))
        }
    };
    Ok((raw, json))
}

/// Mimir 2.x's remote write (`/api/v1/push`, the distributor's handler):
/// snappy-compressed, whatever the headers say, and a 1.0 `WriteRequest`;
/// anything else 400. Stored like a push, as it came.
fn mimir_remote_write(body: &[u8]) -> Result<(), Refusal> {
    remote_write_1_0(body).map(drop)
}

/// A body read as a snappy remote-write 1.0 `WriteRequest`, whatever the
/// headers say (a 2.0 body reads as one without series); 400 otherwise.
fn remote_write_1_0(body: &[u8]) -> Result<tenant_proxy::enforce::prompb::WriteRequest, Refusal> {
    use prost::Message;
    use tenant_proxy::enforce::prompb::WriteRequest;
    let bad = |e: String| (StatusCode::BAD_REQUEST, e);
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| bad(e.to_string()))?;
    WriteRequest::decode(raw.as_slice()).map_err(|e| bad(e.to_string()))
}

/// Thanos Receive's `/api/v1/receive` (`pkg/receive/handler.go`, before
/// it read 2.0): a snappy remote-write 1.0 body (400 otherwise), stored
/// under the tenant its `THANOS-TENANT` names, or `default-tenant` without
/// one; 200 with no body. A request without series (a 2.0 body read as
/// 1.0) is skipped, stored nowhere, and still answered 200.
fn thanos_receive(state: &State, received: &Received) -> Response<Full<Bytes>> {
    match remote_write_1_0(&received.body) {
        Err((status, text)) => return reply(status, text),
        Ok(request) if request.timeseries.is_empty() => return reply(StatusCode::OK, ""),
        Ok(_) => {}
    }
    let tenant = header_str(&received.headers, "thanos-tenant").unwrap_or("default-tenant");
    let mut stored = state.pushed.lock().unwrap();
    stored
        .entry(tenant.to_owned())
        .or_default()
        .extend(lossy(&received.body));
    reply(StatusCode::OK, "")
}

/// An OTLP export request of type `M` as Loki's `/otlp/v1/logs`
/// (`pkg/loghttp/push/otlp.go`) and Mimir's `/otlp/v1/metrics` read it:
/// protobuf or JSON, gzip or not; a body that does not decode is 400.
fn otlp_decodes<M: prost::Message + Default>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Refusal> {
    let (raw, json) = otlp_body(headers, body)?;
    let decoded = if json {
        serde_json::from_slice::<serde_json::Value>(&raw)
            .map(|_| ())
            .map_err(|e| e.to_string())
    } else {
        M::decode(raw.as_slice())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    decoded.map_err(|e| (StatusCode::BAD_REQUEST, e))
}

/// Prometheus 3.x's OTLP receiver: protobuf (its JSON decoding is not
/// needed: the proxy refuses JSON in label mode), gzip or not, translated
/// into samples by [`super::otlp_metrics::samples`].
fn prometheus3_otlp(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<super::otlp_metrics::Sample>, Refusal> {
    use prost::Message;
    let (raw, json) = otlp_body(headers, body)?;
    if json {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "this stand-in reads protobuf".into(),
        ));
    }
    let request = ExportMetricsServiceRequest::decode(raw.as_slice())
        .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(super::otlp_metrics::samples(&request))
}

/// A body stored as one line, as it came.
fn lossy(body: &[u8]) -> Vec<String> {
    vec![String::from_utf8_lossy(body).into_owned()]
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Refuses a tail that is not a WebSocket handshake the way Loki's tail
/// handler does (gorilla/websocket's `Upgrader.Upgrade`, v1.5: each header
/// read as a comma-separated token list, case-insensitively; Loki allows
/// any `Origin`). The proxy must pass the handshake on whole, or not at all.
fn websocket_handshake(
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), (StatusCode, &'static str)> {
    let lists = |name: &str, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value.to_str().is_ok_and(|value| {
                value
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    let bad = StatusCode::BAD_REQUEST;
    if method != Method::GET {
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            "websocket: not a websocket handshake: request method is not GET",
        ));
    }
    if !lists("connection", "upgrade") {
        return Err((bad, "websocket: not a websocket handshake: 'upgrade' token not found in 'Connection' header"));
    }
    if !lists("upgrade", "websocket") {
        return Err((
            bad,
            "websocket: not a websocket handshake: 'websocket' token not found in 'Upgrade' header",
        ));
    }
    if !lists("sec-websocket-version", "13") {
        return Err((
            bad,
            "websocket: unsupported version: 13 not found in 'Sec-Websocket-Version' header",
        ));
    }
    if header_str(headers, "sec-websocket-key").is_none_or(str::is_empty) {
        return Err((
            bad,
            "websocket: not a websocket handshake: `Sec-Websocket-Key' header is missing or blank",
        ));
    }
    Ok(())
}

/// Answers 101 and then: sends `tenant=<id>`, echoes each text message as
/// `echo:<text>`, and completes the close handshake. The text `end` makes
/// it end the tail itself, as Loki's tail handler does when its tail fails
/// (`pkg/querier/tail/http.go`, v3: a close frame, 1011 with the error's
/// text). Loki then closes its tailer and the connection; the stand-in
/// waits for the client's reply instead, which stretches that window so
/// that a test can act within it.
fn accept_websocket(
    headers: &HeaderMap,
    upgrade: hyper::upgrade::OnUpgrade,
    tenant: String,
) -> Response<Full<Bytes>> {
    let key = &headers["sec-websocket-key"];
    let accept = derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        let upgraded = upgrade.await.expect("client upgraded");
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        ws.send(Message::text(format!("tenant={tenant}")))
            .await
            .unwrap();
        // Polling on after a Close frame lets tungstenite send its reply.
        while let Some(Ok(message)) = ws.next().await {
            match message {
                Message::Text(text) if text.as_str() == "end" => {
                    let ended = CloseFrame {
                        code: CloseCode::Error,
                        reason: "tail ended".into(),
                    };
                    // Fails once the client has gone: nothing to tell.
                    let _ = ws.close(Some(ended)).await;
                }
                Message::Text(text) => {
                    ws.send(Message::text(format!("echo:{text}")))
                        .await
                        .unwrap();
                }
                _ => {}
            }
        }
    });
    let mut response = reply(StatusCode::SWITCHING_PROTOCOLS, "");
    let h = response.headers_mut();
    h.insert(header::CONNECTION, "upgrade".parse().unwrap());
    h.insert(header::UPGRADE, "websocket".parse().unwrap());
    h.insert("sec-websocket-accept", accept.parse().unwrap());
    response
}
