//! TLS towards ZooKeeper's secure client port: the client's options from a
//! [`ZkConfig`](crate::ZkConfig), and, when no session could be made, a handshake of our own
//! that says why (the client only reports that no server answered).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lock_core::LockError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use zookeeper_client::TlsOptions;

use crate::config::ZkConfig;

/// The longest the diagnosing handshake may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the client and the diagnosing handshake trust and present, read once.
struct Material {
    /// PEM: the authorities of `tls_ca`, or the system's.
    authorities: String,
    /// PEM: the client certificate (chain) and its key, for mutual TLS.
    identity: Option<(String, String)>,
}

fn tls_error(message: impl std::fmt::Display) -> LockError {
    LockError::config(format!("zookeeper: {message}"))
}

fn read(path: &Path, parameter: &str) -> Result<String, LockError> {
    std::fs::read_to_string(path).map_err(|error| {
        tls_error(format!(
            "cannot read {parameter} {}: {error}",
            path.display()
        ))
    })
}

impl Material {
    fn read(config: &ZkConfig) -> Result<Self, LockError> {
        let authorities = match &config.tls_ca {
            Some(path) => read(path, "tls_ca")?,
            None => rustls_native_certs::load_native_certs()
                .certs
                .iter()
                .map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.as_ref())))
                .collect(),
        };
        let identity = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some((read(cert, "tls_cert")?, read(key, "tls_key")?)),
            _ => None,
        };
        Ok(Material {
            authorities,
            identity,
        })
    }
}

/// The client's TLS options for `config` (which uses TLS): the authorities of `tls_ca` or
/// the system's, the client identity of `tls_cert` and `tls_key`, host names verified.
///
/// # Errors
///
/// [`LockError::Config`] when a file cannot be read or holds no certificate or key.
pub(crate) fn client_options(config: &ZkConfig) -> Result<TlsOptions, LockError> {
    // rustls needs a process-wide crypto provider; keep one the application chose.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let material = Material::read(config)?;
    let what = match &config.tls_ca {
        Some(path) => format!("tls_ca {}", path.display()),
        None => "the system's root certificates".to_owned(),
    };
    let mut options = TlsOptions::new()
        .with_pem_ca(&material.authorities)
        .map_err(|error| tls_error(format!("{what}: {error}")))?;
    if let Some((cert, key)) = &material.identity {
        options = options
            .with_pem_identity(cert, key)
            .map_err(|error| tls_error(format!("tls_cert or tls_key: {error}")))?;
    }
    Ok(options)
}

/// Why no TLS session could be made with `host` (`host:port`), as one handshake with the
/// same authorities and identity tells it within `bound`; `None` when that handshake
/// succeeds (the cause lies elsewhere) or cannot be tried.
pub(crate) async fn handshake_failure(
    config: &ZkConfig,
    host: &str,
    bound: Duration,
) -> Option<String> {
    let material = Material::read(config).ok()?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(
        CertificateDer::pem_slice_iter(material.authorities.as_bytes()).filter_map(Result::ok),
    );
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let tls = match &material.identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
        None => builder.with_no_client_auth(),
    };
    let (name, _port) = host.rsplit_once(':')?;
    let server = ServerName::try_from(name.trim_matches(['[', ']']).to_owned()).ok()?;
    let handshake = async {
        let stream = match tokio::net::TcpStream::connect(host).await {
            Ok(stream) => stream,
            Err(error) => return Err(format!("no TCP connection to {host}: {error}")),
        };
        tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(server, stream)
            .await
            .map_err(|error| format!("a TLS handshake with {host} failed: {error}"))
    };
    match tokio::time::timeout(bound, handshake).await {
        Ok(Ok(_)) => None,
        Ok(Err(why)) => Some(why),
        Err(_) => Some(format!(
            "a TLS handshake with {host} did not finish within {bound:?}"
        )),
    }
}
