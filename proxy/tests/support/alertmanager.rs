//! A real Alertmanager (Debian's `prometheus-alertmanager`, 0.25) on a free
//! loopback port with a temporary data directory, clustering off, stopped
//! by its PID when dropped. Alerts are posted straight to it, as the
//! platform's Prometheus would.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::{Method, StatusCode};

/// The receiver's URL carries a token: it must never reach a tenant.
pub const WEBHOOK_SECRET: &str = "s3cr3t-webhook-token";

pub struct AlertmanagerProcess {
    pub url: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for AlertmanagerProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl AlertmanagerProcess {
    /// One receiver, `hook`, whose URL carries [`WEBHOOK_SECRET`].
    pub async fn start() -> Self {
        let config = format!(
            "route:\n  receiver: hook\n  group_by: [namespace]\nreceivers:\n  - name: hook\n    \
             webhook_configs:\n      - url: http://127.0.0.1:9/hook?token={WEBHOOK_SECRET}\n"
        );
        Self::start_with(&config).await
    }

    /// With `config` as its `alertmanager.yml`.
    pub async fn start_with(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("alertmanager.yml"), config).unwrap();
        let addr = super::closed_port().await;
        let child = Command::new("prometheus-alertmanager")
            .args([
                "--config.file=alertmanager.yml",
                "--storage.path=data",
                &format!("--web.listen-address={addr}"),
                "--cluster.listen-address=",
                "--log.level=warn",
            ])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the prometheus-alertmanager binary (Debian package; .ci/run installs it)");
        let process = Self {
            url: format!("http://{addr}"),
            child,
            _dir: dir,
        };
        // An external process gives no other signal than answering.
        super::eventually("alertmanager ready", Duration::from_secs(30), async || {
            let ready = process.call(Method::GET, "/-/ready", "").await;
            ready.is_some_and(|r| r.status == StatusCode::OK)
        })
        .await;
        process
    }

    /// One call straight to Alertmanager (no proxy); `None` if it did not answer.
    pub async fn call(&self, method: Method, path: &str, body: &str) -> Option<super::Reply> {
        let url = format!("{}{path}", self.url);
        let headers = [("content-type", "application/json")];
        super::try_send(method, &url, None, &headers, body.to_owned()).await
    }

    /// Posts alerts, one per namespace, as the platform's Prometheus would.
    pub async fn fire(&self, alertname: &str, namespaces: &[&str]) {
        let alerts: Vec<serde_json::Value> = namespaces
            .iter()
            .map(|ns| serde_json::json!({"labels": {"alertname": alertname, "namespace": ns}}))
            .collect();
        let body = serde_json::Value::from(alerts).to_string();
        let reply = self
            .call(Method::POST, "/api/v2/alerts", &body)
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
}
