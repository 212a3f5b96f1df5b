"""Language detection (server/detect.py): accuracy and time per text, in the served languages and in others.

The detector reads every language py3langid knows, the served ones `--prior` times likelier (1: none likelier; a
huge prior is detection restricted to the served languages, as the server did before). Texts: a hand-written list
of common one-to-three-word UI strings in English and Brazilian Portuguese (below), the held-out test split of the
corpus (data/corpus/test.en and test.pt, made by `tolk data build`; not committed) by length, or, without it, a few
sentences written here; and UI strings and sentences in French, German, Spanish, Italian and Dutch, which a server
of en and pt must detect as themselves (and refuse), not as en or pt. Prints a table and writes JSON. Never run by
the test suite.

    python bench/detect.py                         # served en,pt; priors 1, 5, 20 and 1e12
    python bench/detect.py --served en,pt,es --prior 20
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.detect import PRIOR, Detector  # noqa: E402

# (English, Brazilian Portuguese): menu items, buttons and messages. Strings that are the same in both languages
# ("OK", "PDF", "Menu") are left out: no detector can get both right.
UI_STRINGS = [
    ("Save", "Salvar"), ("Open", "Abrir"), ("Close", "Fechar"), ("Cancel", "Cancelar"), ("Delete", "Excluir"),
    ("Edit", "Editar"), ("View", "Exibir"), ("Help", "Ajuda"), ("Settings", "Configurações"),
    ("Preferences", "Preferências"), ("Print", "Imprimir"), ("Copy", "Copiar"), ("Paste", "Colar"),
    ("Cut", "Recortar"), ("Undo", "Desfazer"), ("Redo", "Refazer"), ("Search", "Pesquisar"), ("Find", "Localizar"),
    ("Replace", "Substituir"), ("Exit", "Sair"), ("Back", "Voltar"), ("Next", "Próximo"),
    ("Previous", "Anterior"), ("Finish", "Concluir"), ("Apply", "Aplicar"), ("Reset", "Redefinir"),
    ("Refresh", "Atualizar"), ("Download", "Baixar"), ("Share", "Compartilhar"), ("Send", "Enviar"),
    ("Reply", "Responder"), ("Forward", "Encaminhar"), ("Add", "Adicionar"), ("Remove", "Remover"),
    ("Rename", "Renomear"), ("Select all", "Selecionar tudo"), ("Open file", "Abrir arquivo"),
    ("Save as", "Salvar como"), ("New folder", "Nova pasta"), ("Recent files", "Arquivos recentes"),
    ("Sign in", "Entrar"), ("Sign out", "Sair da conta"), ("Create account", "Criar conta"),
    ("Forgot password?", "Esqueceu a senha?"), ("Change password", "Alterar senha"), ("Show more", "Mostrar mais"),
    ("Show less", "Mostrar menos"), ("Try again", "Tentar novamente"), ("Learn more", "Saiba mais"),
    ("Zoom in", "Aumentar zoom"), ("Zoom out", "Diminuir zoom"), ("Full screen", "Tela cheia"),
    ("Import", "Importar"), ("Export", "Exportar"), ("Import data", "Importar dados"), ("File", "Arquivo"),
    ("Tools", "Ferramentas"), ("Window", "Janela"), ("About", "Sobre"), ("Yes", "Sim"), ("No", "Não"),
    ("Continue", "Continuar"), ("Skip", "Pular"), ("Done", "Concluído"), ("Loading…", "Carregando…"),
    ("Please wait", "Aguarde"), ("Save changes", "Salvar alterações"), ("Discard changes", "Descartar alterações"),
    ("Close window", "Fechar janela"), ("Insert image", "Inserir imagem"),
    ("Privacy policy", "Política de privacidade"), ("Terms of service", "Termos de serviço"),
    ("Contact us", "Fale conosco"), ("Home", "Início"), ("Profile", "Perfil"), ("Notifications", "Notificações"),
    ("Messages", "Mensagens"), ("Account settings", "Configurações da conta"), ("Language", "Idioma"),
    ("Dark mode", "Modo escuro"), ("Light theme", "Tema claro"), ("Keyboard shortcuts", "Atalhos de teclado"),
    ("Check for updates", "Verificar atualizações"), ("Page not found", "Página não encontrada"),
    ("Network error", "Erro de rede"), ("Access denied", "Acesso negado"), ("Unknown error", "Erro desconhecido"),
    ("Welcome back!", "Bem-vindo de volta!"), ("Thank you!", "Obrigado!"), ("Good morning", "Bom dia"),
]

# Stand-ins for the test split when it is not there (English, Brazilian Portuguese).
SENTENCES = [
    ("The file could not be saved because the disk is full.",
     "O arquivo não pôde ser salvo porque o disco está cheio."),
    ("Do you want to save the changes you made to this document?",
     "Deseja salvar as alterações feitas neste documento?"),
    ("Your password must contain at least eight characters.", "Sua senha deve conter pelo menos oito caracteres."),
    ("The connection to the server was lost. Trying again in a few seconds.",
     "A conexão com o servidor foi perdida. Tentando novamente em alguns segundos."),
    ("Select the folder where the downloaded files will be stored.",
     "Selecione a pasta onde os arquivos baixados serão armazenados."),
    ("This program is free software; you can redistribute it and modify it.",
     "Este programa é software livre; você pode redistribuí-lo e modificá-lo."),
    ("An error occurred while reading the configuration file.",
     "Ocorreu um erro ao ler o arquivo de configuração."),
    ("Click here to open the settings window.", "Clique aqui para abrir a janela de configurações."),
]


# Languages a server of en and pt does not serve: UI strings, then sentences, each language's own.
OTHERS = {
    "fr": ["Enregistrer", "Ouvrir le fichier", "Annuler", "Paramètres du compte", "Mot de passe oublié ?",
           "Le fichier n'a pas pu être ouvert car le disque est plein.", "Bonjour tout le monde",
           "Voulez-vous enregistrer les modifications apportées à ce document ?",
           "La connexion au serveur a été perdue. Nouvelle tentative dans quelques secondes.",
           "Cliquez ici pour ouvrir la fenêtre des paramètres."],
    "de": ["Speichern", "Datei öffnen", "Abbrechen", "Kontoeinstellungen", "Passwort vergessen?",
           "Die Datei konnte nicht geöffnet werden, weil die Festplatte voll ist.", "Hallo Welt",
           "Möchten Sie die Änderungen an diesem Dokument speichern?",
           "Die Verbindung zum Server wurde unterbrochen. Neuer Versuch in wenigen Sekunden.",
           "Klicken Sie hier, um das Einstellungsfenster zu öffnen."],
    "es": ["Guardar", "Abrir archivo", "Cancelar", "Configuración de la cuenta", "¿Olvidaste tu contraseña?",
           "No se pudo abrir el archivo porque el disco está lleno.", "Hola a todos",
           "¿Desea guardar los cambios realizados en este documento?",
           "Se perdió la conexión con el servidor. Reintentando en unos segundos.",
           "Haga clic aquí para abrir la ventana de configuración."],
    "it": ["Salva", "Apri file", "Annulla", "Impostazioni dell'account", "Password dimenticata?",
           "Impossibile aprire il file perché il disco è pieno.", "Ciao a tutti",
           "Vuoi salvare le modifiche apportate a questo documento?",
           "La connessione al server è stata persa. Nuovo tentativo tra pochi secondi.",
           "Fai clic qui per aprire la finestra delle impostazioni."],
    "nl": ["Opslaan", "Bestand openen", "Annuleren", "Accountinstellingen", "Wachtwoord vergeten?",
           "Het bestand kon niet worden geopend omdat de schijf vol is.", "Hallo allemaal",
           "Wilt u de wijzigingen in dit document opslaan?",
           "De verbinding met de server is verbroken. Over enkele seconden opnieuw proberen.",
           "Klik hier om het instellingenvenster te openen."],
}


def corpus_sets(directory: Path) -> dict[str, dict[str, list[str]]]:
    """Texts by set name and language: the UI strings, and the test split by length (or SENTENCES)."""
    sets = {"ui strings, 1-3 words": {"en": [e for e, _ in UI_STRINGS], "pt": [p for _, p in UI_STRINGS]}}
    split = {lang: directory / f"test.{lang}" for lang in ("en", "pt")}
    if not all(path.is_file() for path in split.values()):
        print(f"no test split under {directory}: {len(SENTENCES)} sentences written here stand in for it")
        sets["sentences written here"] = {"en": [e for e, _ in SENTENCES], "pt": [p for _, p in SENTENCES]}
        return sets
    for name, low, high in (("test split, 1-3 words", 1, 3), ("test split, 4-7 words", 4, 7),
                            ("test split, 8+ words", 8, 10**9)):
        sets[name] = {lang: [t for t in path.read_text().splitlines() if low <= len(t.split()) <= high]
                      for lang, path in split.items()}
    return sets


def other_sets() -> dict[str, dict[str, list[str]]]:
    return {"others, ui strings": {lang: texts[:5] for lang, texts in OTHERS.items()},
            "others, sentences": {lang: texts[5:] for lang, texts in OTHERS.items()}}


def measure(detector: Detector, texts: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Per language: texts, accuracy (the best candidate is the text's language) and mean time per text."""
    rows = {}
    for lang, items in texts.items():
        if not items:
            continue
        start = time.perf_counter()
        found = [detector.detect(text, limit=1)[0].language for text in items]
        elapsed = time.perf_counter() - start
        rows[lang] = {"texts": len(items), "accuracy": sum(f == lang for f in found) / len(items),
                      "us_per_text": 1e6 * elapsed / len(items)}
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--served", default="en,pt", help="comma-separated languages the server serves")
    p.add_argument("--prior", type=float, action="append", default=[],
                   help="how much likelier a served language is; repeatable")
    p.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "detect.json")
    args = p.parse_args()
    served = args.served.split(",")
    sets = {**corpus_sets(args.corpus), **other_sets()}
    results = []
    print(f"{'prior':<8} {'texts':<24} {'lang':<4} {'n':>5} {'accuracy':>9} {'us/text':>8}")
    for prior in args.prior or [1.0, 5.0, PRIOR, 1e12]:
        start = time.perf_counter()
        detector = Detector(served, prior)
        load_s = time.perf_counter() - start
        for name, texts in sets.items():
            for lang, row in measure(detector, texts).items():
                results.append({"served": served, "prior": prior, "set": name, "language": lang, **row})
                print(f"{prior:<8g} {name:<24} {lang:<4} {row['texts']:>5} "
                      f"{100 * row['accuracy']:>8.1f}% {row['us_per_text']:>8.1f}")
        print(f"{'':<8} (model loaded in {load_s:.2f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"detector": "py3langid over its languages, the served ones `prior` times "
                                                "likelier", "cpu": platform.processor(), "rows": results},
                                   indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
