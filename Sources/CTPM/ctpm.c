// See ctpm.h. Every handle and every buffer the TSS hands back is released before returning, and
// copies of secrets in the TSS's buffers are zeroed.
#include "ctpm.h"

#include <stdlib.h>
#include <string.h>
#include <tss2/tss2_esys.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>
#include <tss2/tss2_tctildr.h>

struct ctpm {
    TSS2_TCTI_CONTEXT *tcti;
    ESYS_CONTEXT *esys;
};

/* The TPM's own code (without the layer) when `rc` comes from the TPM, or 0. */
static uint32_t tpm_code(uint32_t rc) {
    uint32_t layer = rc & TSS2_RC_LAYER_MASK;
    if (layer != TSS2_TPM_RC_LAYER && layer != TSS2_RESMGR_TPM_RC_LAYER) return 0;
    uint32_t code = rc & 0xFFFF;
    if (code & TPM2_RC_FMT1) return code & (TPM2_RC_FMT1 | 0x3F);
    return code;
}

static int classify(uint32_t rc, int loading) {
    if (rc == TSS2_RC_SUCCESS) return CTPM_OK;
    uint32_t code = tpm_code(rc);
    if (code == 0) {
        uint32_t base = rc & ~TSS2_RC_LAYER_MASK;
        if (base == TSS2_BASE_RC_IO_ERROR || base == TSS2_BASE_RC_NO_CONNECTION || base == TSS2_BASE_RC_TRY_AGAIN ||
            base == TSS2_BASE_RC_NOT_IMPLEMENTED || base == TSS2_BASE_RC_MALFORMED_RESPONSE)
            return CTPM_UNREACHABLE;
        return CTPM_OTHER;
    }
    if (code == TPM2_RC_LOCKOUT) return CTPM_LOCKOUT;
    if (code == TPM2_RC_POLICY_FAIL || code == TPM2_RC_PCR_CHANGED) return CTPM_POLICY;
    if (code == TPM2_RC_AUTH_FAIL || code == TPM2_RC_BAD_AUTH) return CTPM_BAD_AUTH;
    if (loading && (code == TPM2_RC_INTEGRITY || code == TPM2_RC_SIZE || code == TPM2_RC_VALUE || code == TPM2_RC_KEY))
        return CTPM_FOREIGN;
    return CTPM_OTHER;
}

#define FAIL(result, kind) do { *rc = (result); status = (kind); goto done; } while (0)

int ctpm_open(const char *tcti, ctpm **out, uint32_t *rc) {
    *out = NULL;
    ctpm *tpm = calloc(1, sizeof *tpm);
    if (!tpm) { *rc = TSS2_BASE_RC_MEMORY; return CTPM_OTHER; }
    *rc = Tss2_TctiLdr_Initialize(tcti, &tpm->tcti);
    if (*rc != TSS2_RC_SUCCESS) { free(tpm); return CTPM_UNREACHABLE; }
    *rc = Esys_Initialize(&tpm->esys, tpm->tcti, NULL);
    if (*rc != TSS2_RC_SUCCESS) { Tss2_TctiLdr_Finalize(&tpm->tcti); free(tpm); return CTPM_UNREACHABLE; }
    uint32_t started = Esys_Startup(tpm->esys, TPM2_SU_CLEAR);
    if (started != TSS2_RC_SUCCESS && tpm_code(started) != TPM2_RC_INITIALIZE) {
        *rc = started;
        int kind = classify(started, 0);
        ctpm_close(tpm);
        return kind == CTPM_OTHER ? CTPM_UNREACHABLE : kind;
    }
    *rc = TSS2_RC_SUCCESS;
    *out = tpm;
    return CTPM_OK;
}

void ctpm_close(ctpm *tpm) {
    if (!tpm) return;
    if (tpm->esys) Esys_Finalize(&tpm->esys);
    if (tpm->tcti) Tss2_TctiLdr_Finalize(&tpm->tcti);
    free(tpm);
}

/* The storage primary key: the TCG's ECC P-256 SRK template, so the same seed gives the same key. */
static uint32_t create_primary(ctpm *tpm, ESYS_TR *primary) {
    TPM2B_PUBLIC template = {
        .publicArea = {
            .type = TPM2_ALG_ECC,
            .nameAlg = TPM2_ALG_SHA256,
            .objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN |
                                TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT,
            .parameters.eccDetail = {
                .symmetric = { .algorithm = TPM2_ALG_AES, .keyBits.aes = 128, .mode.aes = TPM2_ALG_CFB },
                .scheme = { .scheme = TPM2_ALG_NULL },
                .curveID = TPM2_ECC_NIST_P256,
                .kdf = { .scheme = TPM2_ALG_NULL },
            },
        },
    };
    TPM2B_SENSITIVE_CREATE sensitive = { 0 };
    TPM2B_DATA outside = { 0 };
    TPML_PCR_SELECTION creation = { 0 };
    return Esys_CreatePrimary(tpm->esys, ESYS_TR_RH_OWNER, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &sensitive, &template,
                              &outside, &creation, primary, NULL, NULL, NULL, NULL);
}

static void pcr_selection(uint32_t mask, TPML_PCR_SELECTION *selection) {
    memset(selection, 0, sizeof *selection);
    selection->count = 1;
    selection->pcrSelections[0].hash = TPM2_ALG_SHA256;
    selection->pcrSelections[0].sizeofSelect = 3;
    for (int byte = 0; byte < 3; byte++) selection->pcrSelections[0].pcrSelect[byte] = (mask >> (8 * byte)) & 0xFF;
}

/* A session salted with the primary key, so that secrets cross the bus encrypted (AES-128-CFB). */
static uint32_t start_session(ctpm *tpm, ESYS_TR primary, TPM2_SE type, TPMA_SESSION attributes, ESYS_TR *session) {
    TPMT_SYM_DEF symmetric = { .algorithm = TPM2_ALG_AES, .keyBits.aes = 128, .mode.aes = TPM2_ALG_CFB };
    uint32_t result = Esys_StartAuthSession(tpm->esys, primary, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, NULL, type,
                                            &symmetric, TPM2_ALG_SHA256, session);
    if (result != TSS2_RC_SUCCESS) return result;
    result = Esys_TRSess_SetAttributes(tpm->esys, *session, attributes | TPMA_SESSION_CONTINUESESSION, 0xFF);
    if (result != TSS2_RC_SUCCESS) { Esys_FlushContext(tpm->esys, *session); *session = ESYS_TR_NONE; }
    return result;
}

/* Runs the policy commands on `session`: PolicyPCR when bound, PolicyAuthValue when there is an auth value. */
static uint32_t apply_policy(ctpm *tpm, ESYS_TR session, uint32_t pcr_mask, int with_auth) {
    uint32_t result = TSS2_RC_SUCCESS;
    if (pcr_mask) {
        TPML_PCR_SELECTION selection;
        pcr_selection(pcr_mask, &selection);
        TPM2B_DIGEST empty = { 0 };
        result = Esys_PolicyPCR(tpm->esys, session, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &empty, &selection);
        if (result != TSS2_RC_SUCCESS) return result;
    }
    if (with_auth) result = Esys_PolicyAuthValue(tpm->esys, session, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE);
    return result;
}

int ctpm_seal(ctpm *tpm, const uint8_t *secret, size_t secret_len, uint32_t pcr_mask,
              const uint8_t *auth, size_t auth_len,
              uint8_t *public_out, size_t public_cap, size_t *public_len,
              uint8_t *private_out, size_t private_cap, size_t *private_len, uint32_t *rc) {
    int status = CTPM_OK;
    ESYS_TR primary = ESYS_TR_NONE, trial = ESYS_TR_NONE, session = ESYS_TR_NONE;
    TPM2B_DIGEST *policy = NULL;
    TPM2B_PRIVATE *sealed_private = NULL;
    TPM2B_PUBLIC *sealed_public = NULL;
    TPM2B_SENSITIVE_CREATE sensitive = { 0 };
    *rc = TSS2_RC_SUCCESS;
    *public_len = *private_len = 0;
    /* 128: the TPM 2.0 MAX_SYM_DATA (the TSS buffer is larger). */
    if (secret_len == 0 || secret_len > 128 || secret_len > sizeof sensitive.sensitive.data.buffer || auth_len > 32)
        FAIL(TSS2_ESYS_RC_BAD_VALUE, CTPM_INVALID);

    uint32_t result = create_primary(tpm, &primary);
    if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));

    TPM2B_PUBLIC template = {
        .publicArea = {
            .type = TPM2_ALG_KEYEDHASH,
            .nameAlg = TPM2_ALG_SHA256,
            .objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT,
            .parameters.keyedHashDetail.scheme.scheme = TPM2_ALG_NULL,
        },
    };
    if (!auth_len) template.publicArea.objectAttributes |= TPMA_OBJECT_NODA;
    if (pcr_mask) {
        /* A trial session computes the policy digest for the PCRs' current values. */
        TPMT_SYM_DEF none = { .algorithm = TPM2_ALG_NULL };
        result = Esys_StartAuthSession(tpm->esys, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, NULL,
                                       TPM2_SE_TRIAL, &none, TPM2_ALG_SHA256, &trial);
        if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
        result = apply_policy(tpm, trial, pcr_mask, auth_len > 0);
        if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
        result = Esys_PolicyGetDigest(tpm->esys, trial, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &policy);
        if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
        template.publicArea.authPolicy = *policy;
    } else {
        template.publicArea.objectAttributes |= TPMA_OBJECT_USERWITHAUTH;
    }
    sensitive.sensitive.data.size = (UINT16)secret_len;
    memcpy(sensitive.sensitive.data.buffer, secret, secret_len);
    if (auth_len) {
        sensitive.sensitive.userAuth.size = (UINT16)auth_len;
        memcpy(sensitive.sensitive.userAuth.buffer, auth, auth_len);
    }
    result = start_session(tpm, primary, TPM2_SE_HMAC, TPMA_SESSION_DECRYPT, &session);
    if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
    TPM2B_DATA outside = { 0 };
    TPML_PCR_SELECTION creation = { 0 };
    result = Esys_Create(tpm->esys, primary, ESYS_TR_PASSWORD, session, ESYS_TR_NONE, &sensitive, &template, &outside, &creation,
                         &sealed_private, &sealed_public, NULL, NULL, NULL);
    if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
    size_t offset = 0;
    result = Tss2_MU_TPM2B_PUBLIC_Marshal(sealed_public, public_out, public_cap, &offset);
    if (result != TSS2_RC_SUCCESS) FAIL(result, CTPM_INVALID);
    *public_len = offset;
    offset = 0;
    result = Tss2_MU_TPM2B_PRIVATE_Marshal(sealed_private, private_out, private_cap, &offset);
    if (result != TSS2_RC_SUCCESS) FAIL(result, CTPM_INVALID);
    *private_len = offset;
done:
    explicit_bzero(&sensitive, sizeof sensitive);
    if (session != ESYS_TR_NONE) Esys_FlushContext(tpm->esys, session);
    if (trial != ESYS_TR_NONE) Esys_FlushContext(tpm->esys, trial);
    if (primary != ESYS_TR_NONE) Esys_FlushContext(tpm->esys, primary);
    Esys_Free(policy);
    Esys_Free(sealed_private);
    Esys_Free(sealed_public);
    return status;
}

int ctpm_unseal(ctpm *tpm, const uint8_t *public_blob, size_t public_len, const uint8_t *private_blob, size_t private_len,
                uint32_t pcr_mask, const uint8_t *auth, size_t auth_len,
                uint8_t *out, size_t out_cap, size_t *out_len, uint32_t *rc) {
    int status = CTPM_OK;
    ESYS_TR primary = ESYS_TR_NONE, object = ESYS_TR_NONE, session = ESYS_TR_NONE;
    TPM2B_SENSITIVE_DATA *data = NULL;
    TPM2B_PUBLIC sealed_public = { 0 };
    TPM2B_PRIVATE sealed_private = { 0 };
    TPM2B_AUTH value = { 0 };
    *rc = TSS2_RC_SUCCESS;
    *out_len = 0;
    size_t offset = 0;
    if (auth_len > sizeof value.buffer) FAIL(TSS2_ESYS_RC_BAD_VALUE, CTPM_INVALID);
    uint32_t result = Tss2_MU_TPM2B_PUBLIC_Unmarshal(public_blob, public_len, &offset, &sealed_public);
    if (result != TSS2_RC_SUCCESS || offset != public_len) FAIL(result ? result : TSS2_MU_RC_BAD_SIZE, CTPM_INVALID);
    offset = 0;
    result = Tss2_MU_TPM2B_PRIVATE_Unmarshal(private_blob, private_len, &offset, &sealed_private);
    if (result != TSS2_RC_SUCCESS || offset != private_len) FAIL(result ? result : TSS2_MU_RC_BAD_SIZE, CTPM_INVALID);

    result = create_primary(tpm, &primary);
    if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
    result = Esys_Load(tpm->esys, primary, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &sealed_private, &sealed_public, &object);
    if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 1));
    if (auth_len) {
        value.size = (UINT16)auth_len;
        memcpy(value.buffer, auth, auth_len);
        result = Esys_TR_SetAuth(tpm->esys, object, &value);
        if (result != TSS2_RC_SUCCESS) FAIL(result, CTPM_OTHER);
    }
    if (pcr_mask) {
        result = start_session(tpm, primary, TPM2_SE_POLICY, TPMA_SESSION_ENCRYPT, &session);
        if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
        result = apply_policy(tpm, session, pcr_mask, auth_len > 0);
        if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
    } else {
        result = start_session(tpm, primary, TPM2_SE_HMAC, TPMA_SESSION_ENCRYPT, &session);
        if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
    }
    result = Esys_Unseal(tpm->esys, object, session, ESYS_TR_NONE, ESYS_TR_NONE, &data);
    if (result != TSS2_RC_SUCCESS) FAIL(result, classify(result, 0));
    if (data->size > out_cap) FAIL(TSS2_ESYS_RC_INSUFFICIENT_BUFFER, CTPM_INVALID);
    memcpy(out, data->buffer, data->size);
    *out_len = data->size;
done:
    explicit_bzero(&value, sizeof value);
    if (data) { explicit_bzero(data, sizeof *data); Esys_Free(data); }
    if (session != ESYS_TR_NONE) Esys_FlushContext(tpm->esys, session);
    if (object != ESYS_TR_NONE) Esys_FlushContext(tpm->esys, object);
    if (primary != ESYS_TR_NONE) Esys_FlushContext(tpm->esys, primary);
    return status;
}

int ctpm_lockout_state(ctpm *tpm, uint32_t *counter, uint32_t *max_tries, uint32_t *interval, uint32_t *recovery, uint32_t *rc) {
    TPMS_CAPABILITY_DATA *data = NULL;
    TPMI_YES_NO more = 0;
    *rc = Esys_GetCapability(tpm->esys, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, TPM2_CAP_TPM_PROPERTIES, TPM2_PT_LOCKOUT_COUNTER, 4,
                             &more, &data);
    if (*rc != TSS2_RC_SUCCESS) return classify(*rc, 0);
    for (UINT32 i = 0; i < data->data.tpmProperties.count; i++) {
        TPMS_TAGGED_PROPERTY p = data->data.tpmProperties.tpmProperty[i];
        if (p.property == TPM2_PT_LOCKOUT_COUNTER) *counter = p.value;
        else if (p.property == TPM2_PT_MAX_AUTH_FAIL) *max_tries = p.value;
        else if (p.property == TPM2_PT_LOCKOUT_INTERVAL) *interval = p.value;
        else if (p.property == TPM2_PT_LOCKOUT_RECOVERY) *recovery = p.value;
    }
    Esys_Free(data);
    return CTPM_OK;
}

const char *ctpm_describe(uint32_t rc) { return Tss2_RC_Decode(rc); }
