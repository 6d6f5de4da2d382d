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
