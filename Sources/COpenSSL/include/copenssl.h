// The system's libcrypto (OpenSSL 3, libssl-dev) through its EVP interface, and the few calls
// Custody makes of it wrapped so that a keyed context is reused per thread and key.
#ifndef CUSTODY_COPENSSL_H
#define CUSTODY_COPENSSL_H

#include <stddef.h>
#include <stdint.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/opensslv.h>
#include <openssl/rand.h>

/// An AES-256-GCM key's cipher contexts: one for sealing and one for opening per thread that uses
/// it, keyed on first use and reused for every later message, so that a message costs the cipher
/// and not a key schedule. `key` (32 bytes) is read when a context is made: it must stay valid
/// and unchanged until `custody_gcm_free`. Any number of threads may seal and open at once.
typedef struct custody_gcm custody_gcm;

/// NULL when the loaded providers have no AES-256-GCM, or out of memory. Contexts are made by the
/// threads that use the key, when they first do.
custody_gcm *custody_gcm_new(const uint8_t *key);
/// Frees (and clears) every context of the key. No thread may use it any more.
void custody_gcm_free(custody_gcm *gcm);

/// Seals `length` bytes of `in` into `out` (the same buffer or a disjoint one) with a 12-byte
/// nonce, and writes the 16-byte tag. 1 on success.
int custody_gcm_seal(custody_gcm *gcm, const uint8_t *nonce, const uint8_t *aad, size_t aad_length,
                     const uint8_t *in, size_t length, uint8_t *out, uint8_t *tag);
/// Opens `length` bytes of `in` into `out` if the 16-byte `tag` verifies: 1; else 0, and `out`
/// is zeroed.
int custody_gcm_open(custody_gcm *gcm, const uint8_t *nonce, const uint8_t *aad, size_t aad_length,
                     const uint8_t *in, size_t length, const uint8_t *tag, uint8_t *out);

/// SHA-256 of `length` bytes into `digest` (32 bytes), with the calling thread's digest context.
/// 1 on success.
int custody_sha256(const void *data, size_t length, uint8_t *digest);

/// A run of bytes, one part of a message.
typedef struct custody_bytes {
    const void *bytes;
    size_t length;
} custody_bytes;

/// HMAC-SHA-512 (`sha512` nonzero) or HMAC-SHA-256 with `key` over the concatenation of `parts`,
/// into `mac` (64 or 32 bytes), with the calling thread's digest context. 1 on success; on failure
/// `mac` is zeroed.
int custody_hmac(int sha512, const uint8_t *key, size_t key_length, const custody_bytes *parts, size_t count, uint8_t *mac);

#endif
