/* The CA bundle of a call that names no ca_file. libcurl has one path built
 * in: the Debian libcurl that a wheel bundles (llmretry.libs/) looks for
 * /etc/ssl/certs/ca-certificates.crt, which Fedora, RHEL or openSUSE do not
 * have, and libcurl then fails every HTTPS call ("error setting certificate
 * file") instead of looking elsewhere. So when the built-in bundle cannot be
 * read, the first readable bundle at the places Linux distributions keep
 * theirs is used instead (the list Go's crypto/x509 searches); when it can,
 * or none is found, libcurl's default stands. Decided once per process. */
#include "internal.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stddef.h>
#include <unistd.h>

static const char *const BUNDLES[] = {
    "/etc/ssl/certs/ca-certificates.crt",                /* Debian, Ubuntu, Arch, Gentoo */
    "/etc/pki/tls/certs/ca-bundle.crt",                  /* Fedora, RHEL 6 */
    "/etc/ssl/ca-bundle.pem",                            /* openSUSE */
    "/etc/pki/tls/cacert.pem",                           /* OpenELEC */
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", /* CentOS, RHEL 7 */
    "/etc/ssl/cert.pem",                                 /* Alpine */
};

static const char *chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    const char *built_in = NULL;
#if LIBCURL_VERSION_NUM >= 0x074600 /* 7.70: curl_version_info's cainfo */
    const curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    if (info->age >= CURLVERSION_NINTH)
        built_in = info->cainfo;
#endif
    if (!built_in || access(built_in, R_OK) == 0)
        return;
    for (size_t i = 0; i < sizeof BUNDLES / sizeof BUNDLES[0]; i++) {
        if (access(BUNDLES[i], R_OK) == 0) {
            chosen = BUNDLES[i];
            return;
        }
    }
}

const char *lr_default_ca_file(void)
{
    pthread_once(&chosen_once, choose);
    return chosen;
}
