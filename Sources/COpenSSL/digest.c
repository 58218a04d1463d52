// SHA-256, SHA-512 and HMAC over them with a digest context per thread and algorithm (see
// copenssl.h): a context made and fetched per digest would cost more than hashing a file header,
// and OpenSSL's EVP_MAC and EVP_KDF objects allocate and lock on every use. An HMAC is the two
// hashes of RFC 2104 on that context, its key pads on the caller's stack.
#include "copenssl.h"

#include <pthread.h>

static EVP_MD *digests[2];
static pthread_key_t context_keys[2];
static pthread_once_t fetched = PTHREAD_ONCE_INIT;

static void free_context(void *context) {
    EVP_MD_CTX_free(context);
}

static void fetch_digests(void) {
    digests[0] = EVP_MD_fetch(NULL, "SHA256", NULL);
    digests[1] = EVP_MD_fetch(NULL, "SHA512", NULL);
    pthread_key_create(&context_keys[0], free_context);
    pthread_key_create(&context_keys[1], free_context);
}

// The calling thread's context for `sha512` (0: SHA-256), initialised; NULL on failure.
static EVP_MD_CTX *started(int sha512) {
    pthread_once(&fetched, fetch_digests);
    int which = sha512 ? 1 : 0;
    if (digests[which] == NULL) return NULL;
    EVP_MD_CTX *context = pthread_getspecific(context_keys[which]);
    if (context == NULL) {
        context = EVP_MD_CTX_new();
        if (context == NULL || pthread_setspecific(context_keys[which], context) != 0) {
            EVP_MD_CTX_free(context);
            return NULL;
        }
    }
    return EVP_DigestInit_ex2(context, digests[which], NULL) == 1 ? context : NULL;
}

static int finish(EVP_MD_CTX *context, uint8_t *digest, unsigned int size) {
    unsigned int written = 0;
    return EVP_DigestFinal_ex(context, digest, &written) == 1 && written == size;
}

int custody_sha256(const void *data, size_t length, uint8_t *digest) {
    EVP_MD_CTX *context = started(0);
    int ok = context != NULL && EVP_DigestUpdate(context, data, length) == 1 && finish(context, digest, 32);
    if (!ok) ERR_clear_error();
    return ok;
}

int custody_hmac(int sha512, const uint8_t *key, size_t key_length, const custody_bytes *parts, size_t count, uint8_t *mac) {
    const size_t block = sha512 ? 128 : 64;
    const unsigned int size = sha512 ? 64 : 32;
    uint8_t pad[128], inner[64], hashed_key[64];
    int ok = 1;
    EVP_MD_CTX *context = NULL;
    // A key longer than a block is its digest (RFC 2104, section 2).
    if (key_length > block) {
        context = started(sha512);
        ok = context != NULL && EVP_DigestUpdate(context, key, key_length) == 1 && finish(context, hashed_key, size);
        key = hashed_key;
        key_length = size;
    }
    for (size_t i = 0; i < block; i++) pad[i] = (uint8_t)((i < key_length ? key[i] : 0) ^ 0x36);
    if (ok) {
        context = started(sha512);
        ok = context != NULL && EVP_DigestUpdate(context, pad, block) == 1;
        for (size_t i = 0; ok && i < count; i++) {
            if (parts[i].length > 0) ok = EVP_DigestUpdate(context, parts[i].bytes, parts[i].length) == 1;
        }
        ok = ok && finish(context, inner, size);
    }
    for (size_t i = 0; i < block; i++) pad[i] ^= 0x36 ^ 0x5c;
    if (ok) {
        context = started(sha512);
        ok = context != NULL && EVP_DigestUpdate(context, pad, block) == 1
            && EVP_DigestUpdate(context, inner, size) == 1 && finish(context, mac, size);
    }
    // Nothing keyed stays behind: not the pads, not the inner digest, and not the context's
    // state (started again, it holds only the digest's initial values).
    OPENSSL_cleanse(pad, sizeof(pad));
    OPENSSL_cleanse(inner, sizeof(inner));
    OPENSSL_cleanse(hashed_key, sizeof(hashed_key));
    if (context != NULL) (void)started(sha512);
    if (!ok) {
        ERR_clear_error();
        OPENSSL_cleanse(mac, size);
    }
    return ok;
}
