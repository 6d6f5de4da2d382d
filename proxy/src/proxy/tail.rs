//! Live tail: a WebSocket upgrade passed on, then bytes relayed between
//! both upgraded connections, for as long as the tenants file still grants
//! what opened the tail and the proxy serves.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::admission::Admitted;
use crate::http::headers;
use crate::http::websocket::{Close, FrameBoundary};
use crate::ops::metrics::{GaugeHeld, Metrics};
use crate::tenants::reload::Tenants;
use crate::tenants::{Credential, Scope, TenantStore};

/// `Some(protocol)` for a WebSocket upgrade request (live tail).
pub(super) fn websocket_upgrade(request: &Request<Incoming>) -> Option<HeaderValue> {
    let wants_upgrade = headers::lists(request.headers(), &header::CONNECTION, b"upgrade");
    let protocol = request.headers().get(header::UPGRADE)?;
    (wants_upgrade && protocol.as_bytes().eq_ignore_ascii_case(b"websocket"))
        .then(|| protocol.clone())
}

/// What opened a tail: checked again at every reload of the tenants file.
pub(super) struct Grant {
    pub tenants: Arc<Tenants>,
    pub credential: Arc<Credential>,
    pub scope: Scope,
}

impl Grant {
    /// Whether `store` grants it still: the same user with the same
    /// password hash, tenant, scope and selector. A request is over in
    /// seconds, so one in flight may finish under the file it began with;
    /// a tail streams for as long as Loki lets it (an hour by default), so
    /// a removed or changed credential must end it.
    fn holds_in(&self, store: &TenantStore) -> bool {
        let opened = &self.credential;
        store.credential(&opened.username).is_some_and(|now| {
            now.fingerprint == opened.fingerprint
                && now.tenant.id == opened.tenant.id
                && now.scopes.contains(self.scope)
                && now.selector.as_ref().map(|s| s.as_str())
                    == opened.selector.as_ref().map(|s| s.as_str())
        })
    }

    /// Resolves once a reload no longer grants it (at once if the file in
    /// force already does not).
    async fn revoked(self) {
        let mut reloads = self.tenants.subscribe();
        loop {
            let store = self.tenants.current();
            if !store.is_some_and(|store| self.holds_in(&store)) {
                return;
            }
            if reloads.changed().await.is_err() {
                // No reloader left: the file in force is the last.
                return std::future::pending().await;
            }
        }
    }
}

/// The live tails open now: told to close when the proxy shuts down,
/// which waits (briefly) until they have.
#[derive(Debug)]
pub struct LiveTails {
    /// Each tail holds a receiver for as long as it runs.
    stop: watch::Sender<bool>,
}

impl Default for LiveTails {
    fn default() -> Self {
        Self {
            stop: watch::Sender::new(false),
        }
    }
}

impl LiveTails {
    /// Tells every tail to close (and any opened from now on to close at
    /// once), then waits until each has sent its close frame or given up.
    pub async fn close_all(&self) {
        self.stop.send_replace(true);
        // Each tail gives up after `CLOSE_WRITE_TIMEOUT`; the margin is for
        // its task to be scheduled.
        let _ = tokio::time::timeout(2 * CLOSE_WRITE_TIMEOUT, self.stop.closed()).await;
    }
}

/// Once both sides have switched protocols, relays bytes both ways until
/// either closes, until the tenants file no longer grants what opened the
/// tail, or until the proxy shuts down. In the last two cases the client
/// gets the rest of the server's frame under way and a close frame (1008
/// "credential revoked", or 1001 "proxy shutting down"), unless that takes
/// longer than `CLOSE_WRITE_TIMEOUT`, and both connections are dropped (a
/// revoked client that reconnects gets its 401 or 403). The upstream
/// already answered 101 with the tenant header in force, so nothing in the
/// stream can change the tenant.
pub(super) fn splice_upgraded(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    held: Option<Admitted>,
    grant: Grant,
    tails: &LiveTails,
    metrics: Arc<Metrics>,
) {
    let mut stopping = tails.stop.subscribe();
    // Caught like the request that opened it: a panic here is logged
    // without its message, which could quote what was relayed.
    tokio::spawn(crate::ops::panics::caught(async move {
        let _held = held;
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "websocket upgrade failed");
                return;
            }
        };
        let (mut from_client, mut to_client) = tokio::io::split(TokioIo::new(client));
        let (mut from_upstream, mut to_upstream) = tokio::io::split(TokioIo::new(upstream));
        // Declared after the connections, so dropped before them: the
        // count is down before either side sees the tail end.
        let _open = GaugeHeld::new(&metrics.live_tails);
        let tenant = grant.credential.tenant.id.clone();
        let (mut up, mut down) = (Relay::new(), Relay::new());
        let mut server_frames = FrameBoundary::default();
        let close = tokio::select! {
            relayed = async {
                tokio::try_join!(
                    up.run(&mut from_client, &mut to_upstream, |_| {}),
                    down.run(&mut from_upstream, &mut to_client, |sent| server_frames.advance(sent)),
                )
            } => {
                if let Err(e) = relayed {
                    tracing::debug!(error = %e, "websocket stream ended with an error");
                }
                return;
            }
            () = grant.revoked() => {
                metrics.live_tails_revoked.inc();
                Close::CredentialRevoked
            }
            () = async {
                if stopping.wait_for(|stop| *stop).await.is_err() {
                    // The state dropped without `close_all`, which is
                    // what waits for tails: left to end with the process.
                    std::future::pending::<()>().await;
                }
            } => Close::ShuttingDown,
        };
        let sent = !server_frames.server_closed()
            && tokio::time::timeout(
                CLOSE_WRITE_TIMEOUT,
                end_stream(
                    close,
                    &mut down,
                    &mut from_upstream,
                    &mut to_client,
                    &mut server_frames,
                ),
            )
            .await
            .is_ok_and(|written| written.is_ok());
        tracing::info!(
            tenant = tenant.as_str(),
            reason = close.reason(),
            close_frame_sent = sent,
            "live tail closed by the proxy"
        );
    }));
}

/// How long a tail's client gets to take the rest of the frame under way
/// and the close frame before the connection is dropped anyway.
const CLOSE_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Ends a stream the relay `down` stopped copying at some point: the rest
/// of the server's frame under way (what `down` read and had not written
/// yet, then more from the server if needed, never beyond that frame),
/// then the close frame, then the end of the client's stream.
async fn end_stream<R, W>(
    close: Close,
    down: &mut Relay,
    from: &mut R,
    to: &mut W,
    frames: &mut FrameBoundary,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while !frames.at_boundary() {
        if !down.refill(from).await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let pending = &down.buffer[down.pending.clone()];
        let frame_rest = frames.advance_to_frame_end(pending);
        to.write_all(&pending[..frame_rest]).await?;
        down.pending.start += frame_rest;
    }
    to.write_all(&close.frame()).await?;
    to.shutdown().await
}

/// One direction of the relay. What it read and has not written yet stays
/// in `pending` when `run` is cancelled, so the stream can be ended
/// cleanly from where it stood.
struct Relay {
    buffer: Box<[u8]>,
    pending: Range<usize>,
}

impl Relay {
    fn new() -> Self {
        Self {
            // What `tokio::io::copy` reads at a time.
            buffer: vec![0; 8 * 1024].into_boxed_slice(),
            pending: 0..0,
        }
    }

    /// Reads from `from` if nothing read is pending; `false` once `from`
    /// has ended. Cancel-safe: a read that did not complete took nothing.
    async fn refill<R: AsyncRead + Unpin>(&mut self, from: &mut R) -> io::Result<bool> {
        if self.pending.is_empty() {
            let read = from.read(&mut self.buffer).await?;
            if read == 0 {
                return Ok(false);
            }
            self.pending = 0..read;
        }
        Ok(true)
    }

    /// Copies `from` to `to` until `from` ends, then shuts `to`'s writing
    /// side (as `copy_bidirectional` does). `sent` sees each run of bytes
    /// once `to` took it, so what it has seen is what the peer may already
    /// hold.
    async fn run<R, W>(
        &mut self,
        from: &mut R,
        to: &mut W,
        mut sent: impl FnMut(&[u8]),
    ) -> io::Result<()>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        loop {
            if !self.refill(from).await? {
                return to.shutdown().await;
            }
            while !self.pending.is_empty() {
                let pending = &self.buffer[self.pending.clone()];
                let written = to.write(pending).await?;
                if written == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                sent(&pending[..written]);
                self.pending.start += written;
            }
            to.flush().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::password;
    use crate::tenants::file as tenants_file;

    /// A store of tenants `a` and `b`; alice in `alice_in`, with one hash
    /// whatever the rest of the entry says.
    fn store(hash: &str, alice_in: &str, alice_extra: &str) -> TenantStore {
        let mut text = String::from("tenants:\n");
        for id in ["a", "b"] {
            text.push_str(&format!("- id: {id}\n  users:\n"));
            if id == alice_in {
                text.push_str(&format!(
                    "  - username: alice\n    password_hash: \"{hash}\"\n{alice_extra}"
                ));
            }
            text.push_str(&format!(
                "  - username: other-{id}\n    password_hash: \"{hash}\"\n"
            ));
        }
        tenants_file::parse(&text, 1).unwrap().0
    }

    /// An unmasked text frame, as Loki sends one.
    fn text_frame(text: &str) -> Vec<u8> {
        let mut frame = vec![0x81, text.len() as u8];
        frame.extend_from_slice(text.as_bytes());
        frame
    }

    /// Revoked while the server's frame was half relayed, with some of it
    /// read from the server and not yet taken by the client: the client
    /// gets the rest of that frame, then the close frame, and nothing of
    /// the server's next frame. The rest takes more than one read.
    #[tokio::test]
    async fn a_tail_revoked_mid_frame_ends_that_frame_before_closing() {
        // The server's bytes are read 64 at most at a time.
        let (mut server, mut from_upstream) = tokio::io::duplex(64);
        // The client takes 4 bytes at a time: the relay's writes stall.
        let (mut to_client, mut client) = tokio::io::duplex(4);
        let line = "a long line ".repeat(9);
        let first = text_frame(&format!("{{\"streams\":[\"{line}\"]}}"));
        assert!(first.len() > 9 + 64, "the rest does not fit one read");
        let (head, rest) = first.split_at(9);
        server.write_all(head).await.unwrap();

        let mut down = Relay::new();
        let mut frames = FrameBoundary::default();
        let mut relayed = [0; 4];
        tokio::select! {
            biased;
            copied = down.run(&mut from_upstream, &mut to_client, |sent| frames.advance(sent)) => {
                panic!("the relay ended early: {copied:?}")
            }
            read = client.read_exact(&mut relayed) => { read.unwrap(); }
        }
        assert_eq!(relayed, head[..4], "the first bytes reached the client");
        assert_eq!(down.pending, 4..9, "read from the server, not yet written");
        assert!(!frames.at_boundary(), "revoked mid-frame");

        // The rest of the frame and the next one are sent together.
        let next = text_frame("next");
        let sent_after = [rest, &next].concat();
        let mut after = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(
                end_stream(
                    Close::CredentialRevoked,
                    &mut down,
                    &mut from_upstream,
                    &mut to_client,
                    &mut frames
                ),
                client.read_to_end(&mut after),
                server.write_all(&sent_after),
            )
        });
        let (closed, read, sent) = ended.await.expect("the stream to the client ended");
        sent.unwrap();
        closed.unwrap();
        read.unwrap();
        assert_eq!(
            after,
            [&head[4..], rest, &Close::CredentialRevoked.frame()].concat()
        );
    }

    #[test]
    fn a_grant_holds_while_user_hash_tenant_scope_and_selector_are_unchanged() {
        let hash = password::hash_password("pw").unwrap();
        let read_only = "    scopes: [logs:read]\n";
        let opened = store(&hash, "a", read_only);
        let grant = Grant {
            tenants: Arc::new(Tenants::default()),
            credential: opened.credential("alice").unwrap().clone(),
            scope: Scope::LogsRead,
        };
        assert!(grant.holds_in(&opened));
        assert!(
            grant.holds_in(&store(&hash, "a", read_only)),
            "a new generation, alike"
        );
        let other_hash = password::hash_password("pw").unwrap();
        let lost = [
            ("removed", store(&hash, "none", "")),
            ("another hash", store(&other_hash, "a", read_only)),
            ("another tenant", store(&hash, "b", read_only)),
            (
                "no read scope",
                store(&hash, "a", "    scopes: [logs:write]\n"),
            ),
            (
                "a selector added",
                store(
                    &hash,
                    "a",
                    &format!("{read_only}    selector: '{{app=\"x\"}}'\n"),
                ),
            ),
        ];
        for (what, store) in lost {
            assert!(!grant.holds_in(&store), "{what}");
        }
    }
}
