//! A rustls `CryptoProvider` with chosen stages replaced by ones that do no arithmetic
//! (seed 002's method): key exchange that agrees on a constant secret, signatures that are
//! constant bytes and always verify, and a TLS 1.3 record "cipher" that copies the plaintext
//! and appends a zero tag of AES-GCM's length, so records keep their sizes. The hash and
//! HKDF stay real (the key schedule still runs), as does the random source.
//!
//! Both ends must use it. TLS 1.2 suites are dropped when records are ablated (their record
//! layer is not replaced). Signatures are replaced for ECDSA P-256 with SHA-256, the lab's
//! certificates (`sipsec certs`' default).

use super::Stages;
use rustls::crypto::cipher::{
    AeadKey, InboundOpaqueMessage, InboundPlainMessage, Iv, MessageDecrypter, MessageEncrypter,
    OutboundOpaqueMessage, OutboundPlainMessage, PrefixedPayload, Tls13AeadAlgorithm,
    UnsupportedOperationError,
};
use rustls::crypto::{
    ActiveKeyExchange, CryptoProvider, KeyProvider, SharedSecret, SupportedKxGroup,
    WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{
    alg_id, AlgorithmIdentifier, InvalidSignature, PrivateKeyDer, SignatureVerificationAlgorithm,
};
use rustls::sign::{Signer, SigningKey};
use rustls::{
    ConnectionTrafficSecrets, ContentType, Error, NamedGroup, ProtocolVersion, SignatureAlgorithm,
    SignatureScheme, SupportedCipherSuite, Tls13CipherSuite,
};
use std::sync::Arc;

/// `base` with `stages`' TLS parts made free.
pub fn ablate(mut base: CryptoProvider, stages: Stages) -> CryptoProvider {
    if stages.kx {
        base.kx_groups = base
            .kx_groups
            .iter()
            .map(|g| -> &'static dyn SupportedKxGroup {
                Box::leak(Box::new(NoopKx { name: g.name() }))
            })
            .collect();
    }
    if stages.aead {
        base.cipher_suites = base
            .cipher_suites
            .iter()
            .filter_map(|s| match s {
                SupportedCipherSuite::Tls13(t) => Some(SupportedCipherSuite::Tls13(Box::leak(
                    Box::new(Tls13CipherSuite {
                        common: rustls::CipherSuiteCommon {
                            suite: t.common.suite,
                            hash_provider: t.common.hash_provider,
                            confidentiality_limit: t.common.confidentiality_limit,
                        },
                        hkdf_provider: t.hkdf_provider,
                        aead_alg: &NoopAead,
                        quic: None,
                    }),
                ))),
                SupportedCipherSuite::Tls12(_) => None,
            })
            .collect();
    }
    if stages.sign {
        base.key_provider = &NoopKeys;
        base.signature_verification_algorithms = WebPkiSupportedAlgorithms {
            all: &[&NoopVerify],
            mapping: &[(SignatureScheme::ECDSA_NISTP256_SHA256, &[&NoopVerify])],
        };
    }
    base
}

/// Key exchange under the real group's name: a constant share, a constant secret.
#[derive(Debug)]
struct NoopKx {
    name: NamedGroup,
}

impl NoopKx {
    /// A share of the length the group's real one has (X25519 32 bytes, P-256 65, ...).
    fn share(&self) -> Vec<u8> {
        let len = match self.name {
            NamedGroup::X25519 => 32,
            NamedGroup::secp256r1 => 65,
            NamedGroup::secp384r1 => 97,
            NamedGroup::secp521r1 => 133,
            _ => 32,
        };
        let mut share = vec![0x42; len];
        if len > 32 {
            share[0] = 0x04;
        }
        share
    }
}

impl SupportedKxGroup for NoopKx {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        Ok(Box::new(NoopActiveKx {
            name: self.name,
            share: self.share(),
        }))
    }

    fn name(&self) -> NamedGroup {
        self.name
    }
}

struct NoopActiveKx {
    name: NamedGroup,
    share: Vec<u8>,
}

impl ActiveKeyExchange for NoopActiveKx {
    fn complete(self: Box<Self>, _peer: &[u8]) -> Result<SharedSecret, Error> {
        Ok(SharedSecret::from(&[0x5a; 32][..]))
    }

    fn pub_key(&self) -> &[u8] {
        &self.share
    }

    fn group(&self) -> NamedGroup {
        self.name
    }
}

/// AES-128-GCM's key and tag lengths, and no arithmetic.
struct NoopAead;

const TAG_LEN: usize = 16;

impl Tls13AeadAlgorithm for NoopAead {
    fn encrypter(&self, _key: AeadKey, _iv: Iv) -> Box<dyn MessageEncrypter> {
        Box::new(NoopRecords)
    }

    fn decrypter(&self, _key: AeadKey, _iv: Iv) -> Box<dyn MessageDecrypter> {
        Box::new(NoopRecords)
    }

    fn key_len(&self) -> usize {
        16
    }

    fn extract_keys(
        &self,
        _key: AeadKey,
        _iv: Iv,
    ) -> Result<ConnectionTrafficSecrets, UnsupportedOperationError> {
        Err(UnsupportedOperationError)
    }
}

struct NoopRecords;

impl MessageEncrypter for NoopRecords {
    fn encrypt(
        &mut self,
        msg: OutboundPlainMessage<'_>,
        _seq: u64,
    ) -> Result<OutboundOpaqueMessage, Error> {
        let mut payload =
            PrefixedPayload::with_capacity(self.encrypted_payload_len(msg.payload.len()));
        payload.extend_from_chunks(&msg.payload);
        payload.extend_from_slice(&msg.typ.to_array());
        payload.extend_from_slice(&[0; TAG_LEN]);
        Ok(OutboundOpaqueMessage::new(
            ContentType::ApplicationData,
            ProtocolVersion::TLSv1_2,
            payload,
        ))
    }

    fn encrypted_payload_len(&self, payload_len: usize) -> usize {
        payload_len + 1 + TAG_LEN
    }
}

impl MessageDecrypter for NoopRecords {
    fn decrypt<'a>(
        &mut self,
        mut msg: InboundOpaqueMessage<'a>,
        _seq: u64,
    ) -> Result<InboundPlainMessage<'a>, Error> {
        let len = msg.payload.len();
        if len < TAG_LEN {
            return Err(Error::DecryptError);
        }
        msg.payload.truncate(len - TAG_LEN);
        msg.into_tls13_unpadded_message()
    }
}

/// Any private key, signing as ECDSA P-256 with SHA-256 without arithmetic.
#[derive(Debug)]
struct NoopKeys;

impl KeyProvider for NoopKeys {
    fn load_private_key(
        &self,
        _key_der: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, Error> {
        Ok(Arc::new(NoopKey))
    }
}

#[derive(Debug)]
struct NoopKey;

impl SigningKey for NoopKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP256_SHA256)
            .then(|| Box::new(NoopKey) as Box<dyn Signer>)
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

impl Signer for NoopKey {
    fn sign(&self, _message: &[u8]) -> Result<Vec<u8>, Error> {
        // A DER ECDSA signature's usual length.
        Ok(vec![0x30; 71])
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP256_SHA256
    }
}

/// Verifies every ECDSA P-256 SHA-256 signature (handshakes and certificate chains) without
/// arithmetic.
#[derive(Debug)]
struct NoopVerify;

impl SignatureVerificationAlgorithm for NoopVerify {
    fn verify_signature(
        &self,
        _public_key: &[u8],
        _message: &[u8],
        _signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        Ok(())
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_P256
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_SHA256
    }
}
