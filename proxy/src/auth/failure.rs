//! Why a request was not authenticated, and what its client is told.

use std::time::Duration;

use crate::http::error::ProxyError;

/// Why authentication failed; `reason()` is the metric label. Every variant
/// but the last two reaches the client as the same 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    MissingHeader,
    MalformedHeader,
    UnknownUser,
    WrongPassword,
    Throttled(Duration),
    VerifierBusy,
}

impl AuthFailure {
    pub fn reason(self) -> &'static str {
        match self {
            Self::MissingHeader => "missing",
            Self::MalformedHeader => "malformed",
            Self::UnknownUser => "unknown_user",
            Self::WrongPassword => "wrong_password",
            Self::Throttled(_) => "throttled",
            Self::VerifierBusy => "verifier_busy",
        }
    }

    pub fn into_error(self) -> ProxyError {
        match self {
            Self::Throttled(retry_after) => ProxyError::AuthThrottled { retry_after },
            Self::VerifierBusy => ProxyError::VerifierBusy,
            _ => ProxyError::Unauthenticated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metric's `reason` values are the ones docs/configuration.md
    /// lists; only a throttled login or a busy verifier tells the client
    /// more than 401 (when to come back).
    #[test]
    fn each_failure_has_its_reason_and_its_answer() {
        const WAIT: Duration = Duration::from_secs(7);
        type Answer = fn(&ProxyError) -> bool;
        let unauthenticated: Answer = |e| matches!(e, ProxyError::Unauthenticated);
        let rows: [(AuthFailure, &str, Answer); 6] = [
            (AuthFailure::MissingHeader, "missing", unauthenticated),
            (AuthFailure::MalformedHeader, "malformed", unauthenticated),
            (AuthFailure::UnknownUser, "unknown_user", unauthenticated),
            (
                AuthFailure::WrongPassword,
                "wrong_password",
                unauthenticated,
            ),
            (
                AuthFailure::Throttled(WAIT),
                "throttled",
                |e| matches!(e, ProxyError::AuthThrottled { retry_after } if *retry_after == WAIT),
            ),
            (AuthFailure::VerifierBusy, "verifier_busy", |e| {
                matches!(e, ProxyError::VerifierBusy)
            }),
        ];
        for (failure, reason, answered_as_it_should) in rows {
            assert_eq!(failure.reason(), reason);
            let error = failure.into_error();
            assert!(
                answered_as_it_should(&error),
                "{failure:?} answered {error:?}"
            );
        }
    }
}
