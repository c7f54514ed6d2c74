//! TLS through rustls: used when the connection string requires it, always verifying the
//! server's certificate (its chain, against the configured authorities or the system's,
//! and its host name).

use std::fmt;
use std::sync::Arc;

use lock_core::LockError;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::PostgresConfig;

/// A connector that verifies the server's certificate.
#[derive(Clone)]
pub(crate) struct Tls(pub(crate) MakeRustlsConnect);

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tls(rustls, verified)")
    }
}

/// The connector of `config`'s connections: `None` without TLS.
///
/// # Errors
///
/// [`LockError::Config`] when the authorities' file cannot be read or holds no
/// certificate, or when the system has none.
pub(crate) fn connector(
    config: &PostgresConfig,
    pg: &tokio_postgres::Config,
) -> Result<Option<Tls>, LockError> {
    if pg.get_ssl_mode() != SslMode::Require {
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = match &config.ssl_root_cert {
        Some(path) => {
            let unreadable = |error: rustls::pki_types::pem::Error| {
                LockError::config(format!("postgres: sslrootcert={}: {error}", path.display()))
            };
            let certificates = CertificateDer::pem_file_iter(path)
                .map_err(unreadable)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(unreadable)?;
            roots.add_parsable_certificates(certificates)
        }
        None => roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs),
    };
    if added == 0 {
        return Err(LockError::config(match &config.ssl_root_cert {
            Some(path) => format!(
                "postgres: sslrootcert={}: no certificate in it",
                path.display()
            ),
            None => "postgres: sslmode=require, and the system has no root certificates: \
                     name the server's authority with sslrootcert"
                .to_owned(),
        }));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| LockError::config(format!("postgres: TLS: {error}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(Tls(MakeRustlsConnect::new(tls))))
}
