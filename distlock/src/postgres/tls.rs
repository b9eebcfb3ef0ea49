//! TLS for Postgres connections: libpq's `sslmode` values on rustls with the
//! `ring` provider.
//!
//! The provider is passed explicitly instead of relying on rustls' process
//! default: with two providers linked into one program rustls cannot pick a
//! default and panics at run time (rustls issue
//! <https://github.com/rustls/rustls/issues/1877>).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode as WireSslMode;
use tokio_postgres::{CancelToken, Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Error, Result};

/// libpq's `sslmode`, minus `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS if the server offers it, else plain; the certificate is not
    /// checked (libpq's default).
    #[default]
    Prefer,
    /// TLS or fail; the certificate is not checked (protects against passive
    /// eavesdropping only, as in libpq).
    Require,
    /// TLS with a certificate chain that leads to a trusted root; the host
    /// name is not checked.
    VerifyCa,
    /// TLS with a trusted certificate issued for the host connected to.
    VerifyFull,
}

impl SslMode {
    /// Parses a libpq `sslmode` value.
    pub(super) fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "sslmode={other} is not supported; use disable, prefer, require, verify-ca or verify-full"
                    ),
                ))
            }
        })
    }

    /// What tokio-postgres is told: whether TLS is required. Certificate
    /// checks are the connector's business.
    pub(super) fn wire(self) -> WireSslMode {
        match self {
            SslMode::Disable => WireSslMode::Disable,
            SslMode::Prefer => WireSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireSslMode::Require,
        }
    }
}

/// Where trusted root certificates come from (libpq's `sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RootCerts {
    /// The operating system's store (`sslrootcert=system`, and the default).
    #[default]
    System,
    /// A PEM file of CA certificates (`sslrootcert=/path/to/ca.pem`).
    File(PathBuf),
}

/// The connector every session of one locker uses.
#[derive(Clone)]
pub(super) enum Tls {
    Plain,
    Rustls(MakeRustlsConnect),
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tls::Plain => "Plain",
            Tls::Rustls(_) => "Rustls",
        })
    }
}

/// A connection's I/O driver, boxed so plain and TLS connections look alike.
pub(super) type Driver = BoxFuture<'static, std::result::Result<(), tokio_postgres::Error>>;

impl Tls {
    /// The connector for `mode`, loading root certificates where it verifies.
    pub(super) fn new(mode: SslMode, roots: &RootCerts) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier: Arc<dyn ServerCertVerifier> = match mode {
            SslMode::Disable => return Ok(Tls::Plain),
            SslMode::Prefer | SslMode::Require => Arc::new(Lenient {
                provider: provider.clone(),
                chain: None,
            }),
            SslMode::VerifyCa | SslMode::VerifyFull => {
                let roots = Arc::new(load_roots(roots)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| {
                        Error::invalid("url", format!("cannot set up certificate checks: {e}"))
                    })?;
                if mode == SslMode::VerifyCa {
                    Arc::new(Lenient {
                        provider: provider.clone(),
                        chain: Some(webpki),
                    })
                } else {
                    webpki
                }
            }
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid("url", format!("cannot set up TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Tls::Rustls(MakeRustlsConnect::new(config)))
    }

    /// Opens a connection: the client, and the driver to spawn.
    pub(super) async fn connect(
        &self,
        config: &Config,
    ) -> std::result::Result<(Client, Driver), tokio_postgres::Error> {
        match self {
            Tls::Plain => {
                let (client, connection) = config.connect(NoTls).await?;
                Ok((client, Box::pin(connection)))
            }
            Tls::Rustls(connector) => {
                let (client, connection) = config.connect(connector.clone()).await?;
                Ok((client, Box::pin(connection)))
            }
        }
    }

    /// Asks the server to cancel whatever the session of `token` is running.
    pub(super) async fn cancel(
        &self,
        token: &CancelToken,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        match self {
            Tls::Plain => token.cancel_query(NoTls).await,
            Tls::Rustls(connector) => token.cancel_query(connector.clone()).await,
        }
    }
}

fn load_roots(source: &RootCerts) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match source {
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "no usable CA certificate in the system store ({} errors); name a CA file with sslrootcert=/path/to/ca.pem",
                        found.errors.len()
                    ),
                ));
            }
        }
        RootCerts::File(path) => {
            let (added, ignored) = roots.add_parsable_certificates(read_pem_certificates(path)?);
            if added == 0 {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "sslrootcert {} holds no usable CA certificate ({ignored} unparsable)",
                        path.display()
                    ),
                ));
            }
        }
    }
    Ok(roots)
}

fn read_pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|e| {
        Error::invalid(
            "url",
            format!("cannot read sslrootcert {}: {e}", path.display()),
        )
    })?;
    CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::invalid(
                "url",
                format!("sslrootcert {} is not PEM: {e}", path.display()),
            )
        })
}

/// `sslmode=prefer|require|verify-ca`: what libpq checks in these modes.
/// With no `chain` (prefer, require) any certificate is accepted, as libpq
/// does; with one (verify-ca) the full WebPKI check runs except the host
/// name. Handshake signatures are checked either way, so the session is at
/// least encrypted to whoever holds the certificate's key.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
