// SHA-256 with a digest context per thread (see copenssl.h): a context made and fetched per
// digest would cost more than hashing a file header.
#include "copenssl.h"

#include <pthread.h>

static EVP_MD *sha256_md;
static pthread_once_t fetched = PTHREAD_ONCE_INIT;
static pthread_key_t context_key;

static void free_context(void *context) {
    EVP_MD_CTX_free(context);
}

static void fetch_digest(void) {
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    pthread_key_create(&context_key, free_context);
}

int custody_sha256(const void *data, size_t length, uint8_t *digest) {
    pthread_once(&fetched, fetch_digest);
    if (sha256_md == NULL) {
        ERR_clear_error();
        return 0;
    }
    EVP_MD_CTX *context = pthread_getspecific(context_key);
    if (context == NULL) {
        context = EVP_MD_CTX_new();
        if (context == NULL || pthread_setspecific(context_key, context) != 0) {
            EVP_MD_CTX_free(context);
            ERR_clear_error();
            return 0;
        }
    }
    unsigned int written = 0;
    int ok = EVP_DigestInit_ex2(context, sha256_md, NULL) == 1
        && EVP_DigestUpdate(context, data, length) == 1
        && EVP_DigestFinal_ex(context, digest, &written) == 1
        && written == 32;
    if (!ok) ERR_clear_error();
    return ok;
}
