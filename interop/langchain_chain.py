"""The plan's calls through LangChain (the langchain_* captures): a prompt | ChatOpenAI |
StrOutputParser chain for chat and stream, OpenAIEmbeddings for the embedding, all against
the fake server. Imported after the tracing library has instrumented LangChain and OpenAI."""

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

import callplan

PROMPT = ChatPromptTemplate.from_messages([("system", "{system}"), ("user", "{prompt}")])


def _model(call, stream: bool) -> ChatOpenAI:
    return ChatOpenAI(model=call.model, base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY,
                      max_retries=0, temperature=0.2, max_tokens=64, stream_usage=stream)


def do_call(call) -> dict:
    if call.kind == "embedding":
        # check_embedding_ctx_length=False: no tiktoken download (the text is short anyway)
        emb = OpenAIEmbeddings(model=call.model, base_url=callplan.OPENAI_BASE, api_key=callplan.FAKE_API_KEY,
                               max_retries=0, check_embedding_ctx_length=False)
        return {"dims": len(emb.embed_query(call.prompt))}
    system, user = (m["content"] for m in call.messages())
    inputs = {"system": system, "prompt": user}
    chain = PROMPT | _model(call, call.stream) | StrOutputParser()
    if not call.stream:
        return {"text": chain.invoke(inputs)}
    return callplan.consume_text_stream(chain.stream(inputs))
