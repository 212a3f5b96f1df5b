"""DeepL's documents at DeepL's paths: POST /v2/document, /v2/document/{id} (status), /v2/document/{id}/result.

They are Tolk's /documents (`server/routes/documents.py`, which reads DeepL's field names already) under DeepL's
paths; an upload's characters count towards the key's usage when it is accepted (DeepL counts them once the
document is downloaded).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from server.deepl import deepl_errors
from server.deps import DetectorDep, RegistryDep, SettingsDep, check_api_key
from server.routes import documents

router = APIRouter(tags=["DeepL"])


@router.post("/v2/document", response_model=documents.DocumentHandle,
             openapi_extra={"requestBody": documents.UPLOAD_BODY},
             responses=deepl_errors(400, 401, 403, 404, 413, 422, 429, 456, 503))
async def upload(request: Request, registry: RegistryDep, detector: DetectorDep,
                 settings: SettingsDep) -> documents.DocumentHandle:
    """Upload a document to translate (multipart: `file`, `target_lang`, `source_lang`, `glossary_id`); the key
    travels in the Authorization header, as DeepL's clients send it."""
    check_api_key(request, settings, None)  # refused before the upload is read
    return await documents.upload_document(request, registry, detector, settings)  # (which counts its usage)


router.add_api_route("/v2/document/{document_id}", documents.document_status, methods=["POST"],
                     response_model=documents.DocumentStatus, response_model_exclude_none=True,
                     openapi_extra={"requestBody": documents.KEY_BODY},
                     responses=deepl_errors(400, 401, 403, 404, 413, 422, 503))
RESULT = {200: documents.RESULT_RESPONSES[200], **deepl_errors(400, 401, 403, 404, 413, 422, 503)}
router.add_api_route("/v2/document/{document_id}/result", documents.document_result, methods=["POST"],
                     response_class=Response, openapi_extra={"requestBody": documents.KEY_BODY}, responses=RESULT)
