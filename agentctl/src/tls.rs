//! TLS on the control channel, for a sidecar reached across a network (a container on a
//! remote Docker engine). The supervisor makes a self-signed certificate for each
//! execution and hands agentctl the certificate and its key (`serve --tls-cert --tls-key`,
//! files in its state dir); the client trusts exactly that certificate (pinned by its
//! bytes), nothing else, so neither a CA nor a host name is involved. The bearer token is
//! still required on top.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file holds no certificate or key, or a malformed one.
    #[error("{what}: {reason}")]
    Pem {
        /// Which (`certificate`, `key`).
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificate(pem: &[u8]) -> Result<CertificateDer<'static>, TlsError> {
    CertificateDer::from_pem_slice(pem)
        .map_err(|err| TlsError::Pem { what: "certificate", reason: err.to_string() })
}

/// The server side: serve `cert_pem` with `key_pem` (both PEM).
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ServerConfig, TlsError> {
    let cert = certificate(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|err| TlsError::Pem { what: "key", reason: err.to_string() })?;
    Ok(rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)?)
}

/// The client side: trusts the server only if it presents exactly `cert_pem`.
pub fn pinned_client_config(cert_pem: &[u8]) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let verifier = Pinned { cert: certificate(cert_pem)?, provider: Arc::clone(&provider) };
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// Accepts the one certificate it was given; the handshake's signatures are still checked
/// (the server must hold its key).
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
