//! Certificates made per test (rcgen): a CA and the leaves it signs, PEM.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use std::path::Path;
use std::sync::Arc;

use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// A CA and certificates it signs, as PEM.
pub struct Ca(CertifiedIssuer<'static, KeyPair>);

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Leaf {
    /// Writes the certificate and key into `dir` as `tls.crt` and
    /// `tls.key` (as a mounted `kubernetes.io/tls` Secret holds them), in
    /// place of what is there; the proxy's `tls:` section naming them, to
    /// which more keys may be appended.
    pub fn write_to(&self, dir: &Path) -> String {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        super::replace_file(&cert, &self.cert_pem);
        super::replace_file(&key, &self.key_pem);
        format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n",
            cert.display(),
            key.display()
        )
    }
}

impl Ca {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    pub fn pem(&self) -> String {
        self.0.pem()
    }

    /// A leaf for `name` and 127.0.0.1.
    pub fn issue(&self, name: &str) -> Leaf {
        self.leaf(name, true)
    }

    /// A leaf for `name` only.
    pub fn issue_name_only(&self, name: &str) -> Leaf {
        self.leaf(name, false)
    }

    fn leaf(&self, name: &str, loopback_ip: bool) -> Leaf {
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        if loopback_ip {
            params
                .subject_alt_names
                .push(SanType::IpAddress([127, 0, 0, 1].into()));
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.0.der().clone()).unwrap();
        roots
    }
}

pub fn pem_der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// The crypto provider the proxy uses, agreeing keys only by `group`.
pub fn provider_with_only(group: &'static dyn SupportedKxGroup) -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        kx_groups: vec![group],
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// A TLS server presenting `leaf`; with `client_ca`, clients must present a
/// certificate it signed.
pub fn server_config(leaf: &Leaf, client_ca: Option<&Ca>) -> ServerConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    server_config_with(provider, leaf, client_ca)
}

/// `server_config` on a provider of the caller's.
pub fn server_config_with(
    provider: Arc<CryptoProvider>,
    leaf: &Leaf,
    client_ca: Option<&Ca>,
) -> ServerConfig {
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(Arc::new(ca.roots()), provider)
                .build()
                .unwrap(),
        ),
    };
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    builder
        .with_single_cert(vec![pem_der(&leaf.cert_pem)], key)
        .unwrap()
}
